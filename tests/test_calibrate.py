"""A latency study sized to the machine it runs on: ``time_scale: auto`` and trial 0 on vLLM's
CPU build.

The calibration's arithmetic and the replay it sets are checked without a server; the whole
flow (calibrate once, keep it in the study, replay every trial at the calibrated rate, resume
without calibrating again) with ``tuner run`` against the stand-in server, whose speed does not
matter to what is checked. What the calibration measures on vLLM itself is the capacity search
of ``test_capacity.py``.
"""

from __future__ import annotations

import math
import re
from dataclasses import replace

import optuna
import pytest
from conftest import SHIPPED_TRACE, run_tuner, write_small_trace, write_spec

from tuner.cli.exits import MEETS_SLOS_EXITS
from tuner.engine.environment import HostMemory, host_memory
from tuner.study.capacity.probes import CapacitySettings
from tuner.study.measure.scoring import Score
from tuner.study.measure.trial import TrialOutcome
from tuner.study.plan.space import cpu_kv_share, default_spec_text, runnable_baseline
from tuner.study.plan.spec import AUTO, SpecError, load_spec, parse_spec
from tuner.study.setup import calibrate
from tuner.study.store.record import CAPACITY_ATTR
from tuner.traces.formats import load_trace
from tuner.traces.model import Request
from tuner.traces.workload import build_workload

GIB = 1 << 30


# --- the calibration's arithmetic -------------------------------------------------------------


def outcome(capacity: float, rates: list[float]) -> TrialOutcome:
    points = tuple({"rate_req_per_s": r, "passed": r <= capacity} for r in rates)
    return TrialOutcome(
        {},
        Score(capacity, {}),
        {CAPACITY_ATTR: capacity},
        {"trial_s": 42.0},
        None,
        "",
        points=points,
    )


def search(requests: int = 112, period_s: float = 10.0) -> CapacitySettings:
    window = [Request(i * period_s / requests, 100, 10) for i in range(requests)]
    return calibrate.settings(window, period_s, replay_s=30.0, client_tolerance_s=1.0)


def test_the_window_is_replayed_at_the_load_share_of_what_the_defaults_carried():
    found = calibrate.from_outcome(outcome(2.0, [11.2, 5.6, 2.8, 1.4, 2.0]), search(), 0.5)
    assert found.capacity_req_per_s == 2.0 and found.windows == 5
    assert found.rate_req_per_s == pytest.approx(1.0)
    # The window offers 11.2 req/s as the trace has it: stretched 11.2 times to 1 req/s.
    assert found.time_scale == pytest.approx(11.2)
    assert "2 req/s" in found.describe() and "0.5 x that, 1 req/s" in found.describe()


def test_where_no_rate_met_the_slos_the_lowest_rate_tried_is_the_base():
    found = calibrate.from_outcome(outcome(0.0, [11.2, 5.6, 2.8, 1.4, 0.7, 0.35]), search(), 0.5)
    assert found.capacity_req_per_s == 0 and found.lowest_req_per_s == 0.35
    assert found.rate_req_per_s == pytest.approx(0.175)
    # 30 s at 0.175 req/s would replay 5 requests: the replay is made long enough for 20.
    assert found.replay_s == pytest.approx(20 / 0.175)
    assert "none of the rates tried" in found.describe()


def test_an_engine_that_never_served_is_no_calibration():
    failed = TrialOutcome({}, Score(0.0, {}), {CAPACITY_ATTR: 0.0}, {}, "vLLM exited", "Traceback")
    with pytest.raises(calibrate.CalibrationFailed) as caught:
        calibrate.from_outcome(failed, search(), 0.5)
    assert caught.value.reason == "vLLM exited" and caught.value.log_tail == "Traceback"


def test_a_study_keeps_its_calibration_as_json():
    found = calibrate.from_outcome(outcome(3.0, [11.2, 5.6, 2.8, 4.0]), search(), 0.4)
    study = optuna.create_study()
    study.set_user_attr(calibrate.CALIBRATION_ATTR, found.as_attr())
    assert calibrate.stored(study.user_attrs) == found
    assert calibrate.stored({}) is None


def test_a_calibrated_replay_is_cut_to_its_longest_seconds_and_keeps_the_peak():
    trace = load_trace(SHIPPED_TRACE)
    whole = build_workload(trace, 10.0, 20.0, 4096)
    cut = build_workload(trace, 10.0, 20.0, 4096, longest_replay_s=30.0)
    assert whole.replay_s == 200.0 and cut.replay_s == 30.0
    assert 0 < len(cut.trace) < len(whole.trace)
    assert max(r.arrival_s for r in cut.trace.requests()) < 30.0
    assert cut.trace.requests() == whole.trace.requests()[: len(cut.trace)]
    assert cut.peak_req_per_s == whole.peak_req_per_s == len(whole.trace) / 10.0
    assert "its first 30 s" in cut.describe()
    # Shorter than the cap: nothing is cut.
    assert build_workload(trace, 10.0, 2.0, 4096, longest_replay_s=30.0).cut_s is None


@pytest.mark.parametrize(
    "field, value", [("calibrate_load", 1.5), ("calibrate_load", 0), ("time_scale", "fast")]
)
def test_the_spec_takes_auto_and_a_load_share(tmp_path, field, value):
    base = {"model": "m", "time_scale": AUTO}
    assert parse_spec(base).time_scale == AUTO
    with pytest.raises(SpecError, match=field):
        parse_spec({**base, field: value})


# --- trial 0 on vLLM's CPU build -----------------------------------------------------------


@pytest.mark.parametrize(
    "total_gib, available_gib, share",
    [(10, 7.7, 0.35), (24, 22, 0.45), (64, 63, 0.45), (10, 0.5, 0.05), (8, 0.0, 0.05)],
)
def test_trial_0_takes_at_most_half_of_the_memory_available(total_gib, available_gib, share):
    memory = HostMemory(int(total_gib * GIB), int(available_gib * GIB))
    assert cpu_kv_share(memory) == share
    if available_gib >= 0.1 * total_gib:
        assert cpu_kv_share(memory) * total_gib <= available_gib / 2 + 1e-9


def test_the_baseline_is_sized_only_where_the_spec_leaves_the_kv_cache_to_vllm():
    memory = HostMemory(10 * GIB, 8 * GIB)
    spec = parse_spec({"model": "m"})
    sized, note = runnable_baseline(spec, memory)
    assert sized.baseline == {"gpu-memory-utilization": 0.4}
    assert note is not None and "gpu-memory-utilization 0.4" in note and "0.9" in note
    for own in (
        {"baseline": {"gpu-memory-utilization": 0.2}},
        {"engine_args": {"kv-cache-memory-bytes": GIB}},
    ):
        kept = parse_spec({"model": "m", **own})
        assert runnable_baseline(kept, memory) == (kept, None)
    assert runnable_baseline(spec, None) == (spec, None)


def test_candidates_that_leave_the_kv_cache_to_vllm_are_sized_like_the_baseline():
    """A candidate without a KV-cache argument would start with vLLM's 0.9 of host memory on
    its CPU build, and not start: it gets the baseline's share; one that sets its own keeps it."""
    memory = HostMemory(10 * GIB, 8 * GIB)
    spec = parse_spec(
        {
            "model": "m",
            "baseline": {"gpu-memory-utilization": 0.2},
            "candidates": [{"max-num-seqs": 4}, {"max-num-seqs": 8, "gpu-memory-utilization": 0.1}],
        }
    )
    sized, note = runnable_baseline(spec, memory)
    assert sized.baseline == {"gpu-memory-utilization": 0.2}
    assert sized.candidates == (
        {"max-num-seqs": 4, "gpu-memory-utilization": 0.4},
        {"max-num-seqs": 8, "gpu-memory-utilization": 0.1},
    )
    assert note is not None and "the spec's candidates run with" in note
    assert "trial 0" not in note
    both = runnable_baseline(replace(spec, baseline={}), memory)[1]
    assert both is not None and "trial 0 runs vLLM's defaults and the spec's candidates" in both


@pytest.mark.parametrize(
    ("total_gib", "available_gib", "low", "high"),
    [
        # At most half of what is available; at least 1.5 GiB, more than vLLM's CPU worker holds
        # before its KV cache.
        (10, 5, 0.15, 0.25),
        (11.6, 9.9, 0.15, 0.4),
        (64, 60, 0.05, 0.45),
        # Little available: still two levels, from the least that starts.
        (10, 1, 0.15, 0.2),
    ],
)
def test_the_default_cpu_space_offers_only_shares_that_start(
    tmp_path, total_gib, available_gib, low, high
):
    memory = HostMemory(int(total_gib * GIB), int(available_gib * GIB))
    text = default_spec_text("m", gpu=False, cpu_memory=memory)
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    spec = load_spec(path)
    share = next(d for d in spec.space if d.name == "gpu-memory-utilization")
    assert (share.low, share.high) == (low, high)
    assert share.low * total_gib >= 1.5
    # Two cores hold tuner's client for tenths of a second: a window is trusted up to 1 s late
    # there (the GPU default, 5 ms, ranked nothing on two cores).
    assert spec.client_tolerance_s == 1.0
    gpu = tmp_path / "gpu.yaml"
    gpu.write_text(default_spec_text("m", gpu=True))
    assert load_spec(gpu).client_tolerance_s == 0.005


def test_memory_is_read_as_vllm_reads_it(tmp_path):
    node = tmp_path / "node0"
    node.write_text(
        "Node 0 MemTotal:       10000000 kB\nNode 0 MemFree:          1000000 kB\n"
        "Node 0 Active(file):     500000 kB\nNode 0 Inactive(file):   250000 kB\n"
        "Node 0 SReclaimable:     250000 kB\nNode 0 HugePages_Total:     0\n"
    )
    machine = tmp_path / "meminfo"
    machine.write_text("MemTotal:       20000000 kB\nMemAvailable:   15000000 kB\n")
    cgroup = tmp_path / "cgroup"
    cgroup.mkdir()
    assert host_memory(str(node), str(machine), str(cgroup)) == HostMemory(
        10_000_000 * 1024, 2_000_000 * 1024
    )
    # No node file: the machine's figures.
    assert host_memory(str(tmp_path / "none"), str(machine), str(cgroup)) == HostMemory(
        20_000_000 * 1024, 15_000_000 * 1024
    )
    # A cgroup limit below the total clamps both.
    (cgroup / "memory.max").write_text(f"{4 * GIB}\n")
    (cgroup / "memory.current").write_text(f"{3 * GIB}\n")
    assert host_memory(str(tmp_path / "none"), str(machine), str(cgroup)) == HostMemory(
        4 * GIB, GIB
    )
    assert host_memory(str(tmp_path / "none"), str(tmp_path / "none"), str(cgroup)) is None


# --- the whole flow, against the stand-in server ----------------------------------------------


@pytest.mark.vllm
def test_a_calibrated_study_replays_every_trial_at_the_calibrated_rate(
    tmp_path, cpu_model, stand_in_vllm
):
    write_small_trace(tmp_path / "trace.csv")
    spec = {
        "model": str(cpu_model),
        "engine_args": {"max-model-len": 4096},
        "search_space": {"max-num-seqs": {"type": "int", "low": 1, "high": 8}},
        "slos": {"ttft_p95_s": 2.0, "tpot_p95_s": 0.5, "e2e_p99_s": 10.0},
        "window_s": 10,
        "time_scale": "auto",
        "calibrate_load": 0.5,
        "calibrate_replay_s": 3,
        "n_trials": 2,
        "confirm_top_k": 0,
        "prune_factor": 0,
        "client_tolerance_s": 60.0,
    }
    write_spec(tmp_path / "s.yaml", spec)
    args = ["run", "--trace", "trace.csv", "--study", "s", "--spec", "s.yaml"]
    # Two requests stream at once, about 60 ms each: a capacity near 30 req/s, which the
    # calibration's search brackets within a few windows of 3 s.
    env = {**stand_in_vllm, "STAND_IN_TOKEN_S": "0.002", "STAND_IN_SLOTS": "2"}
    done = run_tuner(*args, cwd=tmp_path, env=env, timeout_s=600)
    assert done.returncode in MEETS_SLOS_EXITS, done.stdout + done.stderr
    line = re.search(
        r"^calibrated \((\d+) rates.*time scale ([\d.e+-]+)\), for at most 3 s$", done.stdout, re.M
    )
    assert line, done.stdout
    study = optuna.load_study(study_name="s", storage=f"sqlite:///{tmp_path}/studies/s.db")
    found = calibrate.stored(study.user_attrs)
    assert found is not None and found.windows == int(line[1])
    # 40 requests a quarter second apart: a window of 9.75 s as the trace has it.
    assert found.capacity_req_per_s > 0 and found.window_req_per_s == pytest.approx(40 / 9.75)
    # Every trial replayed the window at the calibrated rate, cut to 3 s.
    assert study.user_attrs["workload"]["time_scale"] == pytest.approx(found.time_scale)
    for trial in study.trials:
        sent = trial.user_attrs["requests"]
        assert sent == len([t for t in range(40) if 0.25 * t * found.time_scale < 3.0])
    # The calibration engine is not a trial; trial 0 is vLLM's defaults.
    assert len(study.trials) == 2 and (tmp_path / "runs" / "s" / "calibration").is_dir()
    # A resumed study replays what it replayed: no second calibration.
    again = run_tuner(*args, "--n-trials", "1", cwd=tmp_path, env=env, timeout_s=600)
    assert again.returncode in MEETS_SLOS_EXITS, again.stdout + again.stderr
    assert "calibrating" not in again.stdout and line[0] in again.stdout
    assert math.isclose(
        optuna.load_study(study_name="s", storage=f"sqlite:///{tmp_path}/studies/s.db").user_attrs[
            "workload"
        ]["time_scale"],
        found.time_scale,
    )


def test_a_study_not_yet_calibrated_writes_nothing_without_trials(tmp_path, cpu_model):
    write_small_trace(tmp_path / "trace.csv")
    write_spec(tmp_path / "s.yaml", {"model": str(cpu_model), "time_scale": "auto"})
    done = run_tuner(
        "run",
        "--trace",
        "trace.csv",
        "--study",
        "s",
        "--spec",
        "s.yaml",
        "--n-trials",
        "0",
        cwd=tmp_path,
    )
    assert done.returncode == 2 and "no calibration yet" in done.stderr, done.stdout + done.stderr


def test_the_calibration_starts_vllms_defaults_beside_your_configuration(cpu_model):
    # A spec of its own baseline (your configuration) calibrates on its {} candidate, vLLM's
    # defaults as the study runs them (the machine's KV share added); without one, on the
    # baseline, as before.
    base = {"model": str(cpu_model), "dummy_model": None, "engine_args": {"enforce-eager": True}}
    mine = parse_spec(
        base | {"baseline": {"max-num-seqs": 2}, "candidates": [{"max-num-seqs": 4}, {}]}
    )
    sized = replace(mine, candidates=({"max-num-seqs": 4}, {"gpu-memory-utilization": 0.1}))
    assert calibrate.defaults_args(sized) == {"enforce-eager": True, "gpu-memory-utilization": 0.1}
    alone = parse_spec(base | {"baseline": {"max-num-seqs": 2}})
    assert calibrate.defaults_args(alone) == {"enforce-eager": True, "max-num-seqs": 2}
