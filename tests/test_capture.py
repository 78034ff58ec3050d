"""The CUDA-graph capture range as a search dimension, its pin, and what vLLM's log says of the
compile cache. vLLM's own hashing is tested in ``test_compile_key.py``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml
from conftest import CPU_ENGINE_ARGS, SHIPPED_TRACE, cpu_spec, run_tuner, write_spec

from tuner.engine.startup import breakdown, compile_cache
from tuner.flags import MAX_CAPTURE_SIZE, config_yaml, flag_name, nest, sets_capture_range
from tuner.load.http import ReplaySettings
from tuner.study.measure.scoring import score
from tuner.study.measure.trial import Criteria, TrialOutcome, TrialSetup
from tuner.study.plan.space import (
    CAPTURE_SIZE_CEILING,
    PINNED_CAPTURE_SIZE,
    capture_choices,
    capture_pin,
    default_spec_text,
)
from tuner.study.plan.spec import parse_spec
from tuner.study.trials.search import open_study, run_study

LOGS = Path(__file__).parent / "data" / "engine-logs"
# Engine logs of vLLM 0.26.0 on the H100: a start that compiled, one served from the cache.
COMPILED_LOG = LOGS / "h100-story-trial-0000.log"
CACHED_LOG = LOGS / "h100-fork-1.log"


def test_a_dotted_name_is_a_field_of_a_nested_config():
    assert flag_name("compilation_config.max_cudagraph_capture_size") == MAX_CAPTURE_SIZE
    assert flag_name("--compilation-config.cudagraph-mode") == "compilation-config.cudagraph_mode"
    text = config_yaml({"model": "m", "max_num_seqs": 8, MAX_CAPTURE_SIZE: 512})
    assert text == (
        "model: m\nmax-num-seqs: 8\ncompilation-config:\n  max_cudagraph_capture_size: 512\n"
    )


def test_none_leaves_the_field_to_vllm():
    assert config_yaml({"model": "m", MAX_CAPTURE_SIZE: None}) == "model: m\n"
    assert nest({"compilation-config": {"mode": 0}, MAX_CAPTURE_SIZE: None}) == {
        "compilation-config": {"mode": 0}
    }


def test_a_dotted_field_joins_the_configs_own_mapping_once():
    assert nest({"compilation-config": {"mode": 0}, MAX_CAPTURE_SIZE: 256}) == {
        "compilation-config": {"mode": 0, "max_cudagraph_capture_size": 256}
    }
    with pytest.raises(ValueError, match="given twice"):
        nest({"compilation-config": {"max_cudagraph_capture_size": 8}, MAX_CAPTURE_SIZE: 256})
    with pytest.raises(ValueError, match="not a mapping"):
        nest({"compilation-config": "{}", MAX_CAPTURE_SIZE: 256})


def test_sets_capture_range():
    assert sets_capture_range({MAX_CAPTURE_SIZE: 256})
    assert sets_capture_range({"compilation-config": {"cudagraph_capture_sizes": [1, 2]}})
    assert not sets_capture_range({MAX_CAPTURE_SIZE: None, "max-num-seqs": 4})


def test_capture_choices_cover_the_steps_of_the_trace():
    # The founding story: prompts of 10 to 200 tokens beside up to 32 decodes.
    assert capture_choices(list(range(10, 201)), 32) == [256, 512]
    # Long prompts: up to the ceiling, not beyond.
    assert capture_choices([1000, 2000, 4000], 32) == [CAPTURE_SIZE_CEILING]
    # Short ones: small steps only.
    assert capture_choices([5] * 10, 4) == [16]
    # No prompt lengths (a concurrency trace): vLLM's own ceiling.
    assert capture_choices(None, 32) == [PINNED_CAPTURE_SIZE]
    # The GPU space's max-num-seqs runs from 1 to 1024: its low end is a median prompt beside
    # one decode, so the story trace keeps the ranges of 128 to 512.
    assert capture_choices(list(range(10, 201)), 1024, 1) == [128, 256, 512, 1024, 2048]


def test_the_gpu_default_spec_searches_the_range_and_batched_token_levels():
    prompts = list(range(10, 201))
    spec = parse_spec(yaml.safe_load(default_spec_text("m", gpu=True, prompt_tokens=prompts)))
    dims = {d.name: d for d in spec.space}
    # No device known: max-num-seqs 1 to 256, so steps of a median prompt beside one decode
    # to two long prompts beside 256 decodes; vLLM's own range at 256 (512) is the default.
    assert dims[MAX_CAPTURE_SIZE].choices == (128, 256, 512, 1024)
    assert dims[MAX_CAPTURE_SIZE].default == 512
    assert dims["max-num-batched-tokens"].kind == "categorical"
    assert spec.baseline == {}  # trial 0: vLLM's defaults
    # The CPU build's default spec is what it was: no range, no levels, no pin.
    cpu = parse_spec(yaml.safe_load(default_spec_text("m")))
    assert MAX_CAPTURE_SIZE not in {d.name for d in cpu.space}
    assert "capture" not in default_spec_text("m")
    assert capture_pin(cpu, cpu_build=True) == {}


def test_the_range_is_pinned_only_where_it_is_neither_searched_nor_set_nor_off():
    def spec(**over: Any):
        raw = {"search_space": {"max-num-seqs": {"type": "int", "low": 1, "high": 32}}}
        return parse_spec({**raw, **over})

    assert capture_pin(spec(), cpu_build=False) == {MAX_CAPTURE_SIZE: PINNED_CAPTURE_SIZE}
    assert capture_pin(spec(), cpu_build=True) == {}
    assert capture_pin(spec(engine_args={"enforce-eager": True}), cpu_build=False) == {}
    fixed = {"compilation-config": {"cudagraph_capture_sizes": [1, 8]}}
    assert capture_pin(spec(engine_args=fixed), cpu_build=False) == {}
    searched = {MAX_CAPTURE_SIZE: {"type": "categorical", "choices": [None, 512]}}
    assert capture_pin(spec(search_space=searched), cpu_build=False) == {}


def test_a_spec_setting_the_same_field_twice_is_refused():
    from tuner.errors import SpecError

    with pytest.raises(SpecError, match="given twice"):
        parse_spec(
            {
                "engine_args": {"compilation-config": {"max_cudagraph_capture_size": 8}},
                "search_space": {MAX_CAPTURE_SIZE: {"type": "categorical", "choices": [8, 16]}},
            }
        )


def _setup() -> TrialSetup:
    return TrialSetup(
        model="m",
        requests=(),
        replay=ReplaySettings(model="m", vocab_size=100),
        criteria=Criteria(slos={"e2e_p99_s": 10.0}, weights={"e2e_p99_s": 1.0}),
    )


def test_searched_trials_carry_the_pin_and_the_baseline_and_candidates_do_not(tmp_path: Path):
    spec = parse_spec(
        {
            "model": "m",
            "dummy_model": None,
            "engine_args": {},
            "candidates": [{"max-num-seqs": 16}],
            "search_space": {"max-num-seqs": {"type": "int", "low": 1, "high": 32}},
            "slos": {"e2e_p99_s": 10.0},
            "weights": {"e2e_p99_s": 1.0},
        }
    )
    ran: list[dict[str, Any]] = []

    def runner(args, setup, workdir, should_stop=None) -> TrialOutcome:
        ran.append(dict(args))
        metrics = {"e2e_p99_s": 1.0, "error_rate": 0.0}
        facts: dict[str, str | bool] = {"compile_key": "k", "compile_cache_hit": len(ran) > 2}
        result = score(metrics, Criteria({"e2e_p99_s": 10.0}, {"e2e_p99_s": 1.0}))
        return TrialOutcome(args, result, metrics, {}, compile_cache=facts)

    storage = f"sqlite:///{tmp_path / 's.db'}"
    pin = capture_pin(spec, cpu_build=False)
    run_study(open_study("s", storage, 0), spec, _setup(), tmp_path, 4, runner=runner, pinned=pin)
    assert MAX_CAPTURE_SIZE not in ran[0]  # baseline
    assert ran[1] == {"max-num-seqs": 16}  # candidate, as given
    assert all(args[MAX_CAPTURE_SIZE] == PINNED_CAPTURE_SIZE for args in ran[2:])
    trials = optuna.load_study(study_name="s", storage=storage).trials
    assert [t.user_attrs["compile_cache_hit"] for t in trials] == [False, False, True, True]
    assert {t.user_attrs["compile_key"] for t in trials} == {"k"}


def test_the_log_says_whether_the_compile_came_from_the_cache():
    compiled = compile_cache(COMPILED_LOG.read_text())
    cached = compile_cache(CACHED_LOG.read_text())
    assert compiled == {"compile_key": "055c803a03", "compile_cache_hit": False}
    assert cached == {"compile_key": "7dfaee1c09", "compile_cache_hit": True}
    # An eager engine (the CPU demo) compiles nothing and says nothing.
    assert compile_cache("INFO [core.py:133] Initializing a V1 LLM engine (v0.32.0)") == {}


def test_breakdown_shows_compile_capture_and_the_rest_of_engine_init():
    text = COMPILED_LOG.read_text()
    phases = breakdown({}, text, healthy_s=90.0)
    assert phases["torch_compile_s"] == pytest.approx(37.83)
    assert phases["cuda_graph_s"] == 7.0
    assert phases["engine_init_s"] == pytest.approx(73.35)
    assert phases["init_rest_s"] == pytest.approx(73.35 - 37.83 - 7.0)


# On the CPU build of vLLM: the dimension reaches a real server and the emitted config.


@pytest.mark.vllm
def test_a_searched_capture_range_reaches_vllm_and_the_emitted_config(
    cpu_model: Path, tmp_path: Path
) -> None:
    """One served trial: the baseline is refused by vLLM's engine at once (``max-model-len`` past
    the model's positions, a few seconds of imports), and again when it is started once more,
    so the only trial that serves is the one that drew the range."""
    spec = cpu_spec(
        cpu_model,
        window_s=1,
        engine_args={**CPU_ENGINE_ARGS, "gpu-memory-utilization": 0.2},
        baseline={"max-model-len": 100_000_000},
        search_space={MAX_CAPTURE_SIZE: {"type": "categorical", "choices": [48, 64]}},
    )
    write_spec(tmp_path / "spec.yaml", spec)
    storage = f"sqlite:///{tmp_path / 'cap.db'}"
    result = run_tuner(
        "run", "--trace", SHIPPED_TRACE, "--study", "cap", "--spec", tmp_path / "spec.yaml",
        "--storage", storage, "--n-trials", "3", "--configs", tmp_path / "configs",
        "--runs", tmp_path / "runs", cwd=tmp_path, timeout_s=600,
    )  # fmt: skip
    # 0 or 3: the trial that drew the range wrote the configuration, whether or not its one-second
    # window met the SLOs on a busy machine (its latencies are not what this test is about).
    assert result.returncode in (0, 3), result.stderr[-3000:]
    baseline, again, searched = optuna.load_study(study_name="cap", storage=storage).trials
    assert baseline.user_attrs["feasible"] is False and again.user_attrs["feasible"] is False
    drawn = searched.params[MAX_CAPTURE_SIZE]
    assert drawn in (48, 64)
    assert searched.state == optuna.trial.TrialState.COMPLETE
    assert searched.user_attrs["throughput_req_per_s"] > 0, searched.user_attrs.get("reason")
    trial_dir = tmp_path / "runs" / "cap" / f"trial-{searched.number:04d}"
    engine_config = yaml.safe_load((trial_dir / "engine.yaml").read_text())
    assert engine_config["compilation-config"] == {"max_cudagraph_capture_size": drawn}
    # vLLM read it: its compilation config, as it logs it, carries the value.
    log = (trial_dir / "engine.log").read_text(errors="replace")
    assert f"'max_cudagraph_capture_size': {drawn}" in log
    emitted = yaml.safe_load((tmp_path / "configs" / "cap.yaml").read_text())
    assert emitted["compilation-config"] == {"max_cudagraph_capture_size": drawn}
    assert f"{MAX_CAPTURE_SIZE}={drawn}" in result.stdout
