"""The study spec: a valid one becomes a frozen object, a bad one names its field."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import yaml

from tuner.errors import SpecError
from tuner.study.plan.space import default_spec_text
from tuner.study.plan.spec import (
    DEFAULT_SPEC,
    EARLIER_WEIGHTS,
    StudySpec,
    load_spec,
    parse_spec,
)


def test_default_spec_text_parses_to_the_defaults():
    spec = parse_spec(yaml.safe_load(default_spec_text()))
    assert spec.model == "models/cpu-demo" and spec.dummy_model == "cpu-demo"
    # The demo model's weights are saved: measured as served.
    assert spec.engine_args == {}
    dummy = parse_spec(yaml.safe_load(default_spec_text(dummy_weights=True)))
    assert dummy.dummy_model == "cpu-demo" and dummy.engine_args == {"load-format": "dummy"}
    assert [d.name for d in spec.space] == list(DEFAULT_SPEC["search_space"])
    assert spec.n_trials == 20
    assert spec.weights == DEFAULT_SPEC["weights"]


@pytest.mark.parametrize("model", ["models/elsewhere", "Qwen/Qwen2.5-0.5B-Instruct"])
def test_a_users_model_is_tuned_on_its_real_weights_with_nothing_added(model):
    spec = parse_spec(yaml.safe_load(default_spec_text(model)))
    assert spec.model == model and spec.dummy_model is None and spec.engine_args == {}
    dummy = parse_spec(yaml.safe_load(default_spec_text(model, dummy_weights=True)))
    assert dummy.dummy_model is None and dummy.engine_args == {"load-format": "dummy"}


def test_the_command_lines_slos_and_weights_are_written_into_a_new_spec():
    overrides = {"slos": {"ttft_p95_s": 0.3}, "weights": {"ttft_p95_s": 1.0}}
    spec = parse_spec(yaml.safe_load(default_spec_text("m", overrides=overrides)))
    assert spec.slos == {"ttft_p95_s": 0.3} and spec.weights == {"ttft_p95_s": 1.0}


def test_names_are_dashed_and_values_kept():
    spec = parse_spec(
        {
            "engine_args": {"load_format": "dummy", "--max-model-len": 4096},
            "baseline": {"gpu_memory_utilization": 0.2},
            "search_space": {
                "max_num_seqs": {"type": "int", "low": 1, "high": 32, "step": 1},
                "block-size": {"type": "categorical", "choices": [16, 32]},
                "gpu-memory-utilization": {"type": "float", "low": 0.1, "high": 0.25, "step": 0.05},
                "max-num-batched-tokens": {"type": "int", "low": 512, "high": 8192, "log": True},
            },
            "n_trials": 3,
            "window_s": 5,
            "time_scale": 4,
        }
    )
    assert spec.engine_args == {"load-format": "dummy", "max-model-len": 4096}
    assert spec.baseline == {"gpu-memory-utilization": 0.2}
    assert spec.candidates == ()
    seqs, block, gmu, batched = spec.space
    assert (seqs.name, seqs.kind, seqs.low, seqs.high, seqs.step) == (
        "max-num-seqs",
        "int",
        1,
        32,
        1,
    )
    assert block.choices == (16, 32)
    assert (gmu.kind, gmu.step) == ("float", 0.05)
    assert batched.log
    assert (spec.window_s, spec.time_scale) == (5.0, 4.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.n_trials = 4


BAD: list[tuple[dict[str, Any], str]] = [
    ({"modle": "x"}, "modle"),
    ({"model": ""}, "model"),
    ({"engine_args": ["load-format"]}, "engine_args"),
    ({"engine_args": {"max_num_seqs": 4, "max-num-seqs": 8}}, "engine_args"),
    ({"engine_args": {"port": 8000}}, "port"),
    ({"baseline": {"host": "0.0.0.0"}}, "host"),
    ({"search_space": {"max-num-seqs": {"type": "integer", "low": 1, "high": 2}}}, "type"),
    ({"search_space": {"max-num-seqs": {"type": "int", "low": 1}}}, "max-num-seqs"),
    ({"search_space": {"max-num-seqs": {"type": "int", "low": 9, "high": 2}}}, "low"),
    ({"search_space": {"max-num-seqs": {"type": "int", "low": 1, "high": 2.5}}}, "max-num-seqs"),
    ({"search_space": {"max-num-seqs": {"type": "int", "low": 1, "high": 8, "bound": 1}}}, "bound"),
    ({"search_space": {"x": {"type": "float", "low": 0, "high": 1, "log": True}}}, "log"),
    ({"search_space": {"x": {"type": "float", "low": "a", "high": 1}}}, "low"),
    ({"search_space": {"x": {"type": "float", "low": 0, "high": 1, "step": -1}}}, "step"),
    ({"search_space": {"block-size": {"type": "categorical", "choices": []}}}, "choices"),
    ({"engine_args": {"max-num-seqs": 8}}, "engine_args.max-num-seqs"),
    ({"slos": {"ttft_p95_ms": 200}}, "slos.ttft_p95_ms"),
    ({"slos": {"ttft_p95_s": 0}}, "slos.ttft_p95_s"),
    ({"slos": {}}, "slos"),
    ({"weights": {"tpot_p99_s": 1.0}}, "weights.tpot_p99_s"),
    ({"weights": {"ttft_p95_s": -1.0}}, "weights.ttft_p95_s"),
    ({EARLIER_WEIGHTS: {"tpot_p99_s": 1.0}}, f"{EARLIER_WEIGHTS}.tpot_p99_s"),
    ({EARLIER_WEIGHTS: {"ttft_p95_s": -1.0}}, f"{EARLIER_WEIGHTS}.ttft_p95_s"),
    ({"n_trials": 0}, "n_trials"),
    ({"n_trials": True}, "n_trials"),
    ({"window_s": -5}, "window_s"),
    ({"time_budget_s": 0}, "time_budget_s"),
    ({"time_budget_s": "10m"}, "time_budget_s"),
    ({"time_scale": "fast"}, "time_scale"),
    ({"seed": 1.5}, "seed"),
    ({"max_error_rate": 2}, "max_error_rate"),
    ({"warmup_requests": -1}, "warmup_requests"),
    ({"dummy_model": "gpt-5"}, "dummy_model"),
    ({"candidates": {"max-num-seqs": 16}}, "candidates"),
    ({"candidates": [{"max-num-seqs": 16}, {}]}, "candidates[1]"),
    ({"candidates": [["max-num-seqs"]]}, "candidates[0]"),
    ({"candidates": [{"max_num_seqs": 4, "max-num-seqs": 8}]}, "candidates[0]"),
    ({"candidates": [{"port": 8000}]}, "port"),
    ({"confirm_candidates": "yes"}, "confirm_candidates"),
    ({"confirm_candidates": 1}, "confirm_candidates"),
    ({"search": "random"}, "search"),
    ({"search_space": {"x": {"type": "categorical", "choices": [1, 2], "default": 3}}}, "default"),
    ({"search_space": {"x": {"type": "int", "low": 1, "high": 2, "default": "a"}}}, "default"),
]


def test_a_dimensions_default_is_vllms_value_and_may_lie_outside_the_range():
    spec = parse_spec(
        {
            "search_space": {
                "max-num-seqs": {"type": "int", "low": 1, "high": 32, "default": 128},
                "capture": {"type": "categorical", "choices": [None, 256], "default": None},
                "gpu-memory-utilization": {"type": "float", "low": 0.1, "high": 0.5},
            }
        }
    )
    seqs, capture, share = spec.space
    assert (seqs.default, seqs.has_default) == (128, True) and isinstance(seqs.default, int)
    assert (capture.default, capture.has_default) == (None, True)
    assert share.has_default is False
    assert spec.search == "incumbent"
    assert parse_spec({"search": "tpe"}).search == "tpe"


@pytest.mark.parametrize(("data", "field"), BAD)
def test_errors_name_the_field(data, field):
    with pytest.raises(SpecError) as caught:
        parse_spec(data, "studies/x.yaml")
    assert field in caught.value.field
    assert str(caught.value).startswith(f"studies/x.yaml: {caught.value.field}: ")


def test_candidates_are_dashed_engine_arguments():
    spec = parse_spec({"candidates": [{"max_num_seqs": 16, "max-num-batched-tokens": 8192}]})
    assert spec.candidates == ({"max-num-seqs": 16, "max-num-batched-tokens": 8192},)


def test_not_a_mapping():
    with pytest.raises(SpecError, match="<top level>"):
        parse_spec(["model"], "s.yaml")


def test_load_spec_reports_file_and_yaml_errors(tmp_path):
    with pytest.raises(SpecError, match="<file>"):
        load_spec(tmp_path / "absent.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("model: [unclosed\n")
    with pytest.raises(SpecError, match="<yaml>") as caught:
        load_spec(broken)
    assert str(caught.value).startswith(str(broken))


def test_load_spec_reads_a_file(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("model: m\nn_trials: 7\nslos: {e2e_p99_s: 9}\nweights: {e2e_p99_s: 1}\n")
    spec = load_spec(path)
    assert (spec.model, spec.n_trials, spec.slos, spec.weights) == (
        "m",
        7,
        {"e2e_p99_s": 9.0},
        {"e2e_p99_s": 1.0},
    )


def test_the_weights_earlier_key_is_read_and_not_beside_them():
    # ``objective`` named the weights before; ``objective_mode`` and ``--objective`` the mode.
    assert EARLIER_WEIGHTS == "objective"
    earlier = {"slos": {"e2e_p99_s": 9}, EARLIER_WEIGHTS: {"e2e_p99_s": 2}}
    assert parse_spec(earlier).weights == {"e2e_p99_s": 2.0}
    assert parse_spec(earlier | {"objective_mode": "capacity"}).objective_mode == "capacity"
    assert EARLIER_WEIGHTS not in DEFAULT_SPEC and "objective:" not in default_spec_text()
    with pytest.raises(SpecError) as caught:
        parse_spec(earlier | {"weights": {"e2e_p99_s": 1}})
    assert EARLIER_WEIGHTS in str(caught.value) and "weights" in str(caught.value)


def test_a_probes_settings_are_read_under_their_earlier_names_and_not_beside_them():
    earlier = {"capacity_window_s": 12, "capacity_max_windows": 4}
    parsed = parse_spec(earlier)
    assert (parsed.capacity_probe_s, parsed.capacity_max_probes) == (12.0, 4)
    assert "capacity_window_s" not in default_spec_text(searches_rates=True)
    with pytest.raises(SpecError) as caught:
        parse_spec({"capacity_window_s": 12, "capacity_probe_s": 10})
    assert "capacity_window_s" in str(caught.value) and "capacity_probe_s" in str(caught.value)


def test_the_default_spec_takes_every_setting_from_studyspec():
    """One source for each default: what a spec that names nothing gets is StudySpec's own."""
    parsed = parse_spec({"model": "m"})
    for f in dataclasses.fields(StudySpec):
        if f.default is not dataclasses.MISSING and f.name not in ("dummy_model", "candidates"):
            assert DEFAULT_SPEC[f.name] == f.default == getattr(parsed, f.name), f.name


def test_a_time_budget_is_seconds_or_none():
    assert parse_spec({}).time_budget_s is None
    assert parse_spec({"time_budget_s": 450}).time_budget_s == 450.0
