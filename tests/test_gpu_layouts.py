"""Layouts over several GPUs (``tuner.study.plan.layouts``): which ones a study measures from the
model's size and the GPUs' memory, which one it keeps (the most req/s per GPU), the trials it then
ranks, and what the run and the YAML say of a server of several GPUs.

Pure functions and scripted studies, no server; the whole ``tuner run --gpus all`` over four
stand-in GPUs is ``tests/test_gpus_layout_run.py``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import struct
from pathlib import Path
from typing import Any

import optuna
import pytest
from conftest import write_small_trace, write_spec

from tuner.cli.children import Child, head_of
from tuner.cli.exits import EXIT_DEFAULTS_KEPT
from tuner.cli.layouts import groups_of, plan_of, size_of
from tuner.cli.main import main
from tuner.cli.result import trial_line
from tuner.engine.dummy_model import SHAPES, model_config
from tuner.engine.environment import Gpu, device_kind
from tuner.engine.model_size import model_size, parameters_of, size_of_config, size_of_files
from tuner.errors import InputError
from tuner.load.http import ReplaySettings
from tuner.study.capacity.probes import capacity_score
from tuner.study.capacity.text import servers_line, table_rows
from tuner.study.measure.scoring import Criteria
from tuner.study.measure.trial import TrialOutcome, TrialSetup
from tuner.study.plan.layouts import (
    WEIGHTS_SHARE_OF_GPU,
    Layout,
    fitting_layouts,
    layout_of,
    pick_layout,
    plan_layouts,
)
from tuner.study.plan.spec import parse_spec
from tuner.study.setup.objective import CAPACITY_OBJECTIVE
from tuner.study.store.record import CAPACITY_ATTR, DEVICE, TrialRecord
from tuner.study.trials import fingerprint, layout_phase
from tuner.study.trials.groups import groups
from tuner.study.trials.search import open_study, run_study

GIB = 1 << 30
GB = 10**9
H100 = 80 * GIB
H200 = 141 * GIB
L4 = 24 * GIB


def layouts(weights: int | None, memory: int | None, gpus: int, heads: int | None = None):
    return [layout.name for layout in fitting_layouts(weights, memory, gpus, heads)]


# --- which layouts ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("weights", "memory", "gpus", "expected"),
    [
        # A 7B model in bf16 (15.2 GB) fits one GPU of any of these: TP1 and TP2, each as one
        # copy and as many copies as the GPUs hold.
        (15 * GB, H100, 1, ["1x1"]),
        (15 * GB, H100, 2, ["1x1", "1x2", "2x1"]),
        (15 * GB, H100, 4, ["1x1", "1x4", "2x1", "2x2"]),
        (15 * GB, H100, 8, ["1x1", "1x8", "2x1", "2x4"]),
        # ...but not an L4's 24 GiB at 80 %: two L4s at least.
        (21 * GB, L4, 1, []),
        (21 * GB, L4, 4, ["2x1", "2x2", "4x1"]),
        # A 70B model in bf16 (141 GB): four H100s (two would be 65.7 GiB each, over 64), two
        # H200s.
        (141 * GB, H100, 2, []),
        (141 * GB, H100, 4, ["4x1"]),
        (141 * GB, H100, 8, ["4x1", "4x2", "8x1"]),
        (141 * GB, H200, 8, ["2x1", "2x4", "4x1", "4x2"]),
        # Memory or weights unknown: from one GPU, as vLLM's default.
        (141 * GB, None, 4, ["1x1", "1x4", "2x1", "2x2"]),
        (None, H100, 2, ["1x1", "1x2", "2x1"]),
    ],
)
def test_the_layouts_measured_follow_the_weights_the_memory_and_the_gpus(
    weights, memory, gpus, expected
):
    assert layouts(weights, memory, gpus) == expected


def test_a_tensor_parallel_size_divides_the_attention_heads():
    # 28 heads (Qwen2.5-7B): 4 divides them, 8 does not, so no TP8 on eight GPUs.
    assert layouts(15 * GB, H100, 8, heads=28) == ["1x1", "1x8", "2x1", "2x4"]
    # 300 GB need eight H100s: 28 heads do not split eight ways, 32 do.
    assert layouts(300 * GB, H100, 8, heads=28) == []
    assert layouts(300 * GB, H100, 8, heads=32) == ["8x1"]


def test_the_weights_share_of_a_gpu_is_the_named_bound():
    memory = 100 * GIB
    fits = int(WEIGHTS_SHARE_OF_GPU * memory)
    assert layouts(fits, memory, 2)[0] == "1x1"
    assert layouts(fits + 1, memory, 2) == ["2x1"]


def test_a_layout_reads_and_says_its_arguments():
    assert Layout.parse("2x2") == Layout(2, 2) and Layout.parse("4") == Layout(4, 1)
    for bad in ("2x", "x2", "0x1", "two", "2x2x2"):
        with pytest.raises(ValueError, match="a layout"):
            Layout.parse(bad)
    assert Layout(2, 1).args == {"tensor-parallel-size": 2} and Layout().args == {}
    assert str(Layout()) == "1 GPU"
    assert str(Layout(2, 1)) == "2 GPUs: tensor-parallel-size 2"
    assert str(Layout(2, 2)) == "4 GPUs: tensor-parallel-size 2, data-parallel-size 2"
    assert layout_of({"tensor-parallel-size": 2, "max-num-seqs": 8}) == Layout(2, 1)
    assert layout_of({"data-parallel-size": "4"}) == Layout(1, 4)
    assert layout_of({}) == Layout()


# --- what a study does with them ----------------------------------------------------------------

GPU_80 = [Gpu(i, f"GPU-{i}", "NVIDIA H100 80GB HBM3", 81559) for i in range(4)]
SPEC = {"model": "m", "slos": {"ttft_p95_s": 2.0}, "weights": {"ttft_p95_s": 1.0}}


def plan(spec: dict[str, Any], weights: int | None = 15 * GB, gpus=GPU_80):
    size = None
    if weights is not None:
        shape = size_of_config(model_config(SHAPES["cpu-demo"]))
        assert shape is not None
        size = dataclasses.replace(shape, weight_bytes=weights)
    parsed = parse_spec({**SPEC, **spec})
    return plan_layouts(parsed, gpus, size, parsed.objective_mode != "latency")


def test_a_capacity_study_measures_every_layout_that_fits_and_latency_the_smallest():
    searched = plan({"objective_mode": "capacity"})
    assert searched.searched and [x.name for x in searched.layouts] == ["1x1", "1x4", "2x1", "2x2"]
    assert "the model's weights 14.0 GiB" in searched.why
    latency = plan({})
    assert not latency.searched and latency.layout == Layout()
    assert "latency at the trace's own rate does not compare per GPU" in latency.why
    big = plan({}, weights=100 * GB)
    assert big.layout == Layout(2, 1) and big.given
    off = plan({"objective_mode": "goodput", "search_layout": False}, weights=100 * GB)
    assert not off.searched and off.layout == Layout(2, 1) and "search_layout is off" in off.why
    with pytest.raises(ValueError, match=r"fit on no layout of these 4 GPUs"):
        plan({"objective_mode": "capacity"}, weights=300 * GB)


def test_a_layout_the_spec_sets_or_searches_is_not_searched():
    fixed = plan({"objective_mode": "capacity", "engine_args": {"tensor-parallel-size": 2}})
    assert (fixed.layouts, fixed.searched, fixed.given) == ((Layout(2, 1),), False, False)
    assert "as the spec sets it" in fixed.why
    # Set for the baseline only: every trial is told it (--layout), so that all run at it.
    baseline = plan({"objective_mode": "capacity", "baseline": {"data-parallel-size": 2}})
    assert baseline.layout == Layout(1, 2) and baseline.given
    space = {"tensor-parallel-size": {"type": "categorical", "choices": [1, 2, 4]}}
    searched = plan({"objective_mode": "capacity", "search_space": space})
    assert searched.layout == Layout(4, 1) and not searched.searched and not searched.given


def test_a_server_larger_than_the_gpus_given_is_bad_input_and_layout_sets_the_plan():
    two = GPU_80[:2]
    pinned = parse_spec({**SPEC, "engine_args": {"tensor-parallel-size": 4}})
    with pytest.raises(InputError, match=r"a server takes 4 GPUs, more than the 2 given"):
        plan_of(argparse.Namespace(layout=None, gpus="0,1"), pinned, two)
    given = plan_of(argparse.Namespace(layout=Layout(2, 1), gpus="all"), parse_spec(SPEC), two)
    assert (given.layout, given.searched, given.why) == (
        Layout(2, 1),
        False,
        "layout: 2 GPUs: tensor-parallel-size 2, as --layout gives it",
    )


def test_the_layout_with_the_most_per_gpu_wins_and_a_tie_goes_to_the_fewest_gpus():
    # Two TP1 servers on two GPUs carry 2 x 10; one TP2 server 30: 15 per GPU beats 10.
    assert pick_layout([(Layout(1, 1), 10.0), (Layout(1, 2), 19.0), (Layout(2, 1), 30.0)], 0.1) == (
        Layout(2, 1)
    )
    # TP1 at 10 per GPU; a DP2 server at 10.5 per GPU is within the search's resolution: a tie.
    assert pick_layout([(Layout(1, 1), 10.0), (Layout(1, 2), 21.0)], 0.1) == Layout(1, 1)
    assert pick_layout([(Layout(2, 2), 40.0), (Layout(2, 1), 18.0)], 0.1) == Layout(2, 1)
    assert pick_layout([(Layout(1, 1), 10.0), (Layout(1, 2), 30.0)], 0.1) == Layout(1, 2)
    # A layout whose server did not start, or met no rate, is not picked; none met: None.
    assert pick_layout([(Layout(1, 1), None), (Layout(2, 1), 4.0)], 0.1) == Layout(2, 1)
    assert pick_layout([(Layout(1, 1), 0.0), (Layout(2, 1), None)], 0.1) is None


def test_gpus_split_into_groups_of_the_layouts_size_and_each_is_named():
    six = [Gpu(i, f"GPU-{i}", "NVIDIA H200", 143771) for i in range(6)]
    grouped = groups_of(six, Layout(2, 2))
    assert [[g.index for g in group] for group in grouped] == [[0, 1, 2, 3]]
    assert [[g.index for g in group] for group in groups_of(six, Layout(2, 1))] == [
        [0, 1],
        [2, 3],
        [4, 5],
    ]
    child = Child(["python", "-m", "tuner.cli", "run", "--layout", "2x1"], tuple(six[2:4]))
    assert child.env["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert child.said() == "CUDA_VISIBLE_DEVICES=2,3 tuner run --layout 2x1"
    assert head_of(six[:1]) == "gpu 0 | " and head_of(six[:2]) == "gpus 0,1 | "


# --- the model's weights ------------------------------------------------------------------------


def test_a_models_parameters_are_counted_from_its_config():
    assert parameters_of(model_config(SHAPES["qwen2.5-7b"])) == pytest.approx(7.6e9, rel=0.01)
    assert parameters_of(model_config(SHAPES["qwen2.5-3b"])) == pytest.approx(3.1e9, rel=0.02)
    assert parameters_of({"hidden_size": 8}) is None
    seven = size_of_config(model_config(SHAPES["qwen2.5-7b"]))
    assert seven is not None and seven.weight_bytes == pytest.approx(15.2e9, rel=0.01)
    assert seven.attention_heads == 28
    in_float32 = size_of_config(model_config(SHAPES["qwen2.5-7b"]), "float32")
    assert in_float32 is not None and in_float32.weight_bytes == 2 * seven.weight_bytes
    quantized = {**model_config(SHAPES["qwen2.5-7b"]), "quantization_config": {"bits": 4}}
    assert size_of_config(quantized) is None


def write_safetensors(path: Path, tensors: dict[str, tuple[str, list[int]]]) -> None:
    """A safetensors file of these tensors' dtypes and shapes, its data zeros."""
    header: dict[str, Any] = {}
    offset = 0
    for name, (dtype, shape) in tensors.items():
        count = 1
        for n in shape:
            count *= n
        size = count * {"BF16": 2, "F32": 4, "I8": 1}[dtype]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(offset))


def test_the_weights_in_files_are_read_from_their_headers_at_the_dtype_loaded(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(model_config(SHAPES["cpu-tiny"])))
    write_safetensors(tmp_path / "model-1.safetensors", {"a": ("BF16", [100, 10])})
    write_safetensors(tmp_path / "model-2.safetensors", {"b": ("BF16", [50]), "q": ("I8", [64])})
    found = model_size(str(tmp_path))
    assert found is not None and found.weight_bytes == 2 * 1000 + 2 * 50 + 64
    assert found.how == "the weights of 2 safetensors files" and found.attention_heads == 4
    # At float32, the float tensors take 4 bytes a value; the int8 one stays as stored.
    config = json.loads((tmp_path / "config.json").read_text())
    wide = size_of_files(tmp_path, config, "float32")
    assert wide is not None and wide.weight_bytes == 4 * 1050 + 64
    # Without weights, the config's shape; a folder without a config: unknown.
    empty = tmp_path / "empty"
    empty.mkdir()
    assert model_size(str(empty)) is None
    (empty / "config.json").write_text(json.dumps(model_config(SHAPES["cpu-tiny"])))
    estimated = model_size(str(empty))
    assert estimated is not None and estimated.how.startswith("estimated from config.json")


def test_the_spec_s_model_is_sized_as_its_engine_arguments_load_it(tmp_path):
    """A dummy model not written yet is sized from its shape; a model quantized on load is
    not sized."""
    dummy = parse_spec({"model": str(tmp_path / "none"), "dummy_model": "qwen2.5-7b"})
    found = size_of(dummy)
    assert found is not None and found.weight_bytes == pytest.approx(15.2e9, rel=0.01)
    quantized = parse_spec({"model": "m", "engine_args": {"quantization": "fp8"}})
    assert size_of(quantized) is None


# --- the fingerprint: one kind of GPU, whatever the count a worker sees -------------------------


def test_a_study_measured_on_two_gpus_continues_on_one_of_that_kind(tmp_path):
    assert device_kind("2x NVIDIA H200") == "NVIDIA H200"
    assert device_kind("2x NVIDIA H200 + NVIDIA L4") == "NVIDIA H200 + NVIDIA L4"
    assert device_kind("CPU Intel Xeon, 2 cores") == "CPU Intel Xeon, 2 cores"
    spec = parse_spec(SPEC)
    study = open_study("s", f"sqlite:///{tmp_path / 's.db'}", 0)
    two = fingerprint.of_study(spec, {}, {DEVICE: "2x NVIDIA H200"})
    assert two[DEVICE] == "NVIDIA H200"
    study.set_user_attr(fingerprint.WORKLOAD_ATTR, {**two, DEVICE: "2x NVIDIA H200"})
    assert (
        fingerprint.check_workload(study, fingerprint.of_study(spec, {}, {DEVICE: "NVIDIA H200"}))
        is None
    )
    with pytest.raises(InputError, match="device"):
        fingerprint.check_workload(study, fingerprint.of_study(spec, {}, {DEVICE: "NVIDIA L4"}))


# --- a scripted study over layouts --------------------------------------------------------------

# What each layout's server carries, req/s: TP2 carries most per GPU (15), a DP2 server of TP1
# twice TP1, TP2 with DP2 twice TP2 (a tie per GPU, its server larger).
CARRIES = {Layout(1, 1): 10.0, Layout(1, 2): 20.0, Layout(2, 1): 30.0, Layout(2, 2): 60.0}
MEASURED = list(CARRIES)


def scripted(tmp_path: Path, cpu_model: Path) -> tuple[optuna.Study, Any, list[str]]:
    """A capacity study whose runner carries ``CARRIES`` by layout (a searched max-num-seqs of 8
    or more adds a tenth), and the ``tuner run`` arguments that write its result."""
    raw = {
        "model": str(cpu_model),
        "dummy_model": None,
        "engine_args": {"load-format": "dummy"},
        "search_space": {"max-num-seqs": {"type": "int", "low": 1, "high": 32, "default": 16}},
        "slos": {"ttft_p95_s": 2.0},
        "weights": {"ttft_p95_s": 1.0},
        "window_s": 5,
        "objective_mode": "capacity",
        "confirm_top_k": 0,
    }
    spec_path = write_spec(tmp_path / "spec.yaml", raw)
    trace = write_small_trace(tmp_path / "trace.csv")
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    args = [
        "run", "--trace", str(trace), "--study", "cap", "--spec", str(spec_path),
        "--storage", storage, "--n-trials", "0", "--configs", str(tmp_path / "configs"),
    ]  # fmt: skip
    return open_study("cap", storage, 0, objective=CAPACITY_OBJECTIVE), parse_spec(raw), args


def runner(args, setup, workdir, should_stop=None) -> TrialOutcome:
    capacity = CARRIES[layout_of(args)] * (1.1 if args.get("max-num-seqs", 0) >= 8 else 1.0)
    metrics = {CAPACITY_ATTR: capacity, "ttft_p95_s": 0.5, "capacity_windows": 2.0}
    points = ({"rate_req_per_s": capacity, "passed": True, "ttft_p95_s": 0.5},)
    return TrialOutcome(args, capacity_score(capacity), metrics, {}, None, points=points)


def setup_of(spec) -> TrialSetup:
    return TrialSetup(
        model=spec.model,
        requests=(),
        replay=ReplaySettings(model="m", vocab_size=100),
        criteria=Criteria(spec.slos, spec.weights),
    )


def test_the_layout_kept_is_the_most_per_gpu_and_the_search_ranks_its_trials_only(
    tmp_path, cpu_model, capsys
):
    study, spec, args = scripted(tmp_path, cpu_model)
    setup = setup_of(spec)
    for layout in MEASURED:  # the layout phase: the baseline at each, one trial each
        run_study(study, spec, setup, tmp_path / "runs", 1, runner=runner, layout=layout)
    trials = layout_phase.layout_trials(study, MEASURED)
    assert [trials[x].number for x in MEASURED] == [0, 1, 2, 3]
    for layout, trial in trials.items():
        recorded = TrialRecord.of(trial)
        assert recorded.baseline and layout_of(recorded.engine_args) == layout
        assert recorded.engine_args.get("load-format") == "dummy"
    kept, lines = layout_phase.choose(study, MEASURED, spec.capacity_resolution)
    # 15 per GPU for TP2 and for TP2 x DP2: a tie, the smaller server kept.
    assert kept == Layout(2, 1) and layout_phase.kept_layout(study) == kept
    said = trial_line(study.trials[2], ["max-num-seqs"])
    assert "[feasible, baseline, 2 GPUs: tensor-parallel-size 2]" in said
    assert "capacity 30 req/s, 15 per GPU (2 rates measured)" in said
    assert "  2 GPUs: tensor-parallel-size 2: trial 2, 30 req/s a server, 15 per GPU" in lines
    assert lines[-1].startswith("layout kept: 2 GPUs: tensor-parallel-size 2, the most req/s")
    # The study now ranks the trials at TP2 only: the TP2 x DP2 server's 60 req/s is not a
    # better configuration of it.
    assert [g.number for g in groups(study)] == [2]
    # The search at the kept layout: its baseline is measured already, the next is a move.
    run_study(study, spec, setup, tmp_path / "runs", 2, runner=runner, layout=kept)
    added = study.trials[4:]
    assert all(layout_of(TrialRecord.of(t).engine_args) == kept for t in added)
    assert not any(TrialRecord.of(t).baseline for t in added)
    assert {g.number for g in groups(study)} == {2, 4, 5}
    # --layout elsewhere than the study's kept one is refused.
    with pytest.raises(InputError, match="the layout it kept from its layout trials"):
        layout_phase.run_layout(study, Layout(1, 1), spec.engine_args)
    # Without a confirmation, vLLM's defaults (at the kept layout) are written.
    assert main(args) == EXIT_DEFAULTS_KEPT
    out = capsys.readouterr().out
    header = (tmp_path / "configs" / "cap.yaml").read_text()
    assert "tensor-parallel-size: 2\n" in header
    assert "# One server on 2 GPUs (tensor-parallel-size 2): CUDA_VISIBLE_DEVICES names them." in (
        header
    )
    # The busiest 5 s of the trace: 20 requests, 4 req/s; 30 req/s a server, on 2 GPUs.
    assert (
        "# servers for the peak (4 req/s): 1 like trial 2 (ceil(4 / 30), if the load splits "
        "evenly), 2 GPUs: one server (2 GPUs: tensor-parallel-size 2) carries 30 req/s, 15 "
        "per GPU"
    ) in header
    assert re.search(r"^per GPU +15 req/s +16.5 req/s$", out, re.M), out
    assert "GPUs for peak" in out and "per GPU" in out


def test_the_capacity_words_say_the_gpus():
    line = servers_line(30.0, 80.0, "trial 4", Layout(2, 1))
    assert line == (
        "servers for the peak (80 req/s): 3 like trial 4 (ceil(80 / 30), if the load splits "
        "evenly), 6 GPUs: one server (2 GPUs: tensor-parallel-size 2) carries 30 req/s, 15 per GPU"
    )
    assert servers_line(30.0, 80.0, "trial 4") == (
        "servers for the peak (80 req/s): 3 like trial 4 (ceil(80 / 30), if the load splits evenly)"
    )
    rows = table_rows(
        {CAPACITY_ATTR: 30.0}, {CAPACITY_ATTR: 10.0}, 80.0, layouts=(Layout(2, 1), Layout(2, 1))
    )
    assert rows[3:] == [
        ("GPUs a server", "2", "2"),
        ("per GPU", "15 req/s", "5 req/s"),
        ("GPUs for peak", "6", "16"),
    ]
    assert len(table_rows({CAPACITY_ATTR: 30.0}, None, 80.0)) == 3
