"""The A/B harness (``benchmarks/ab.py``): arms read from a file, measured through ``Run.measure``
in turns until each has its repeats, resumed from the study, and reported per arm.

The fast tests measure with a scripted runner (``Run``'s ``runner``, values per configuration,
no engine) in a real Optuna study in SQLite; one test runs the harness as a user does, two arms,
one measurement each, on the stand-in server in vLLM's shape.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import REPO, cpu_spec, write_small_trace, write_spec

from tuner.engine.environment import HostMemory
from tuner.engine.launchers import ProcessLauncher
from tuner.report import data
from tuner.study.measure.scoring import Criteria, score
from tuner.study.measure.trial import TrialOutcome, TrialSetup
from tuner.study.plan.spec import StudySpec, parse_spec
from tuner.study.result.run import Run
from tuner.study.result.run_config import resolve
from tuner.study.trials.search import open_study

# A script of benchmarks/, not a package: imported from its folder.
sys.path.insert(0, str(REPO / "benchmarks"))
import ab

SLO_S = 2.0


class ByArm:
    """Scores by max-num-seqs, one per measurement in order; ``fail`` those that raise (an
    interrupted trial)."""

    def __init__(self, scores: Mapping[int, list[float]], fail: int | None = None) -> None:
        self.scores = {k: list(v) for k, v in scores.items()}
        self.fail = fail
        self.order: list[int] = []

    def __call__(
        self, args: Mapping[str, Any], setup: TrialSetup, workdir: Path, should_stop: Any = None
    ) -> TrialOutcome:
        seqs = int(args["max-num-seqs"])
        if seqs == self.fail:
            self.fail = None
            raise KeyboardInterrupt
        self.order.append(seqs)
        value = self.scores[seqs].pop(0)
        metrics = {"ttft_p95_s": value * SLO_S, "error_rate": 0.0}
        scored = score(metrics, Criteria({"ttft_p95_s": SLO_S}, {"ttft_p95_s": 1.0}))
        return TrialOutcome(args, scored, metrics, {})


def spec_of(model: Path) -> StudySpec:
    return parse_spec(
        {
            "model": str(model),
            "dummy_model": None,
            "engine_args": {"load-format": "dummy"},
            "search_space": {"max-num-seqs": {"type": "int", "low": 1, "high": 32}},
            "slos": {"ttft_p95_s": SLO_S},
            "weights": {"ttft_p95_s": 1.0},
            "window_s": 5,
        }
    )


def arms_file(tmp_path: Path, arms: dict[str, Any]) -> Path:
    path = tmp_path / "arms.yaml"
    path.write_text(yaml.safe_dump({"arms": arms}))
    return path


def a_run(tmp_path: Path, spec: StudySpec, runner: ByArm, db: str = "ab.db") -> Run:
    study = open_study("ab", f"sqlite:///{tmp_path / db}", 0)
    config = resolve(spec, "ab", tmp_path / "runs", tmp_path / "written.yaml")
    workload = ab.workload_of(spec, write_small_trace(tmp_path / "t.csv"))
    return Run(study, spec, workload, config, launcher=ProcessLauncher(), runner=runner)


def test_the_arms_are_measured_in_turns_and_reported_per_arm(tmp_path, cpu_model):
    spec = spec_of(cpu_model)
    arms = ab.load_arms(
        arms_file(tmp_path, {"a": {"max-num-seqs": 4}, "b": {"max-num-seqs": 8}}), spec
    )
    runner = ByArm({4: [0.5, 0.7, 0.6], 8: [0.9, 1.5, 0.8]})
    run = a_run(tmp_path, spec, runner)

    assert ab.run_arms(run, arms, 3, say=lambda line: None) == 6
    assert runner.order == [4, 8, 4, 8, 4, 8]
    table = ab.report([run.study], arms)
    # The median and the lowest and highest of each arm; b's 1.5 missed the SLO (1.0).
    assert table[2].startswith("| a | 3 | 3 | 0.600 | 0.500 | 0.700 | 1200.0 |")
    assert table[3].startswith("| b | 3 | 2 | 0.900 | 0.800 | 1.500 | 1800.0 |")
    assert "- a: {'load-format': 'dummy', 'max-num-seqs': 4}" in table


def test_a_rerun_measures_only_what_the_study_lacks(tmp_path, cpu_model):
    spec = spec_of(cpu_model)
    arms = ab.load_arms(
        arms_file(tmp_path, {"a": {"max-num-seqs": 4}, "b": {"max-num-seqs": 8}}), spec
    )
    # The third measurement (a's second) is cut off: the trial is marked FAIL, not counted.
    first = ByArm({4: [0.5], 8: [0.9]}, fail=None)
    assert ab.run_arms(a_run(tmp_path, spec, first), arms, 1, say=lambda line: None) == 2
    cut = ByArm({4: [], 8: []}, fail=4)
    with pytest.raises(KeyboardInterrupt):
        ab.run_arms(a_run(tmp_path, spec, cut), arms, 2, say=lambda line: None)

    again = ByArm({4: [0.6], 8: [1.0]})
    lines: list[str] = []
    assert ab.run_arms(a_run(tmp_path, spec, again), arms, 2, say=lines.append) == 2
    assert again.order == [4, 8]
    assert lines[0] == "2 measurements in the study, 2 to take"


def test_parts_share_the_turns_and_the_report_covers_every_part(tmp_path, cpu_model):
    spec = spec_of(cpu_model)
    file = arms_file(
        tmp_path, {"a": {"max-num-seqs": 4}, "b": {"max-num-seqs": 8}, "c": {"max-num-seqs": 16}}
    )
    arms = ab.load_arms(file, spec)
    first = ByArm({4: [0.5], 8: [0.9], 16: [0.3]})
    second = ByArm({4: [0.7], 8: [1.5], 16: [0.4]})
    lines: list[str] = []
    # Started together, neither sees a measurement of the other: of the turns a b c a b c, the
    # k-th arm's of round r goes to part (k + r) % 2, so each arm is measured by both parts.
    one = a_run(tmp_path, spec, first, db="ab-part-0.db")
    assert ab.run_arms(one, arms, 2, say=lines.append, part=(0, 2)) == 3
    assert first.order == [4, 16, 8] and lines[0].endswith("6 to take, 3 of them in part 0 of 2")
    two = a_run(tmp_path, spec, second, db="ab-part-1.db")
    assert ab.run_arms(two, arms, 2, say=lines.append, part=(1, 2)) == 3
    assert second.order == [8, 4, 16]
    # Run again, a part counts the other's measurements: nothing is left to take.
    assert ab.run_arms(two, arms, 2, say=lines.append, part=(1, 2), others=[one.study]) == 0

    expected = [f"sqlite:///{tmp_path / n}" for n in ("ab-part-0.db", "ab-part-1.db")]
    assert ab.storages(tmp_path) == expected
    table = ab.report([one.study, two.study], arms)
    # Both studies have trials 0 to 2: each measurement counts once, with its own engine start.
    assert table[2].startswith("| a | 2 | 2 | 0.600 | 0.500 | 0.700 |")
    assert table[3].startswith("| b | 2 | 1 | 1.200 | 0.900 | 1.500 |")
    assert table[4].startswith("| c | 2 | 2 | 0.350 | 0.300 | 0.400 |")


def test_an_arms_repeats_go_to_different_parts_when_the_parts_divide_the_arms():
    arms = [ab.Arm(name, {"max-num-seqs": n}) for n, name in enumerate("abcd", 1)]
    todo = ab.rounds(arms, 3, {})
    shares = [ab.share(arms, todo, (w, 4)) for w in range(4)]
    assert [len(s) for s in shares] == [3, 3, 3, 3]
    assert all(len({x.name for x in s}) == 3 for s in shares)


def a_capacity_row(value: float | None, points: list[tuple[float, bool, str]], **figures: float):
    found = tuple({"rate_req_per_s": r, "passed": ok, "reason": why} for r, ok, why in points)
    outcome = data.FEASIBLE if value is not None else data.FAILED
    return data.TrialRow(0, outcome, "searched", {}, value, figures, {}, points=found)


def test_the_second_table_says_what_the_rate_above_capacity_missed_and_where_time_went():
    tpot = a_capacity_row(
        4.6,
        [(12.0, False, "stopped 7 s in: ttft_p95_s lost"), (6.0, False, "missed slo_tpot_p95_s"),
         (4.6, True, ""), (5.1, False, "missed slo_tpot_p95_s")],
        server_queue_mean_s=0.0004, kv_cache_usage_peak=0.011, server_itl_p95_s=0.036,
    )  # fmt: skip
    ttft = a_capacity_row(
        7.2, [(12.0, False, "stopped 7 s in: ttft_p95_s lost"),
              (7.8, False, "stopped 12 s in: ttft_p95_s lost")],
        server_queue_mean_s=0.163, kv_cache_usage_peak=0.019, server_itl_p95_s=0.057,
    )  # fmt: skip
    # The lowest rate above the capacity decides, not the first that failed.
    assert ab.missed_above(tpot) == "tpot_p95_s" and ab.missed_above(ttft) == "ttft_p95_s"
    assert ab.missed_above(a_capacity_row(4.6, [(4.6, True, "")])) is None
    lines = ab.spent(
        {"defaults": [tpot, tpot], "batched-2048": [ttft], "broken": [a_capacity_row(None, [])]}
    )
    assert lines[0].startswith("| arm | missed above capacity | queue ms |")
    assert lines[2].startswith("| defaults | tpot_p95_s (2) | 0 | - | - | 36 | 1.1 |")
    assert lines[3].startswith("| batched-2048 | ttft_p95_s (1) | 163 | - | - | 57 | 1.9 |")
    assert lines[4] == "| broken | - | - | - | - | - | - | - | - | - |"


@pytest.mark.parametrize(("text", "part"), [("0/1", (0, 1)), ("3/4", (3, 4))])
def test_a_part_is_w_of_n(text, part):
    assert ab.parse_part(text) == part


@pytest.mark.parametrize("text", ["4/4", "-1/2", "1", "a/b", "0/0"])
def test_a_part_outside_w_of_n_is_refused(text):
    with pytest.raises(argparse.ArgumentTypeError):
        ab.parse_part(text)


def test_the_turns_go_round_the_arms_from_what_each_lacks():
    a, b, c = (ab.Arm(name, {"max-num-seqs": n}) for name, n in (("a", 1), ("b", 2), ("c", 3)))
    assert [x.name for _, x in ab.rounds([a, b, c], 2, {})] == ["a", "b", "c", "a", "b", "c"]
    assert [x.name for _, x in ab.rounds([a, b, c], 2, {"a": 2, "b": 1})] == ["c", "b", "c"]
    assert ab.rounds([a, b], 1, {"a": 3, "b": 1}) == []


def test_on_the_cpu_build_an_arm_that_does_not_size_its_kv_cache_gets_trial_0s_share(
    tmp_path, cpu_model
):
    gib = 1 << 30
    memory = HostMemory(total_bytes=16 * gib, available_bytes=8 * gib)
    file = arms_file(
        tmp_path,
        {"a": {"max-num-seqs": 4}, "b": {"max-num-seqs": 8, "gpu-memory-utilization": 0.1}},
    )
    a, b = ab.load_arms(file, spec_of(cpu_model), memory)
    assert a.engine_args["gpu-memory-utilization"] == 0.25  # half of what is free, in steps
    assert b.engine_args["gpu-memory-utilization"] == 0.1
    # A rerun with other memory free sizes it otherwise: its earlier trials are still its own.
    assert a.measured({**a.engine_args, "gpu-memory-utilization": 0.3})
    assert not b.measured({**b.engine_args, "gpu-memory-utilization": 0.3})
    # Off the CPU build (no memory given) the arms are as written.
    assert "gpu-memory-utilization" not in ab.load_arms(file, spec_of(cpu_model))[0].engine_args
    # Arms that differ only in the share, one of them sized here, could not be told apart.
    alike = arms_file(
        tmp_path,
        {"a": {"max-num-seqs": 4}, "b": {"max-num-seqs": 4, "gpu-memory-utilization": 0.1}},
    )
    with pytest.raises(ValueError, match="arms 'a' and 'b' are one configuration"):
        ab.load_arms(alike, spec_of(cpu_model), memory)


def test_a_report_reads_trials_sized_on_one_machine_or_as_written_on_another(tmp_path, cpu_model):
    file = arms_file(tmp_path, {"defaults": {}, "memory": {"gpu-memory-utilization": 0.95}})
    # Running on vLLM's CPU build, those two could not be told apart; a report reads both.
    gib = 1 << 30
    with pytest.raises(ValueError, match="one configuration"):
        ab.load_arms(file, spec_of(cpu_model), HostMemory(16 * gib, 8 * gib))
    arms = ab.load_arms(file, spec_of(cpu_model), HostMemory(16 * gib, 8 * gib), reading=True)

    def of(**args: Any) -> str | None:
        found = ab.arm_of(data.TrialRow(0, "feasible", "searched", {"load-format": "dummy", **args},
                                        1.0, {}, {}), arms)  # fmt: skip
        return None if found is None else found.name

    assert of() == "defaults" and of(**{"gpu-memory-utilization": 0.95}) == "memory"
    # A trial of the defaults that a CPU machine sized.
    assert of(**{"gpu-memory-utilization": 0.25}) == "defaults"
    assert of(**{"max-num-seqs": 4}) is None


@pytest.mark.parametrize(
    ("arms", "error"),
    [
        ({"a": {}}, "two or more"),
        ({"a": {}, "b": [1]}, "arm 'b' is not a mapping"),
        ({"a": {"load-format": "dummy"}, "b": {}}, "arms 'a' and 'b' are one configuration"),
    ],
)
def test_an_arms_file_that_is_not_two_configurations_is_refused(tmp_path, cpu_model, arms, error):
    with pytest.raises(ValueError, match=error):
        ab.load_arms(arms_file(tmp_path, arms), spec_of(cpu_model))


@pytest.mark.vllm
def test_the_harness_measures_two_arms_and_reports_them(tmp_path, cpu_model, stand_in_vllm):
    """``benchmarks/ab.py`` as a user runs it, each arm's server the stand-in in vLLM's shape
    (the engine itself is measured on vLLM's CPU build by ``tests/test_run_e2e.py``)."""
    spec = write_spec(tmp_path / "spec.yaml", cpu_spec(cpu_model, confirm_top_k=0))
    trace = write_small_trace(tmp_path / "trace.csv")
    arms = arms_file(tmp_path, {"seqs2": {"max-num-seqs": 2}, "seqs4": {"max-num-seqs": 4}})
    command = [sys.executable, str(REPO / "benchmarks" / "ab.py"), str(arms), "--spec", str(spec),
               "--trace", str(trace), "--out", str(tmp_path / "out"), "--repeats", "1"]  # fmt: skip
    env = {**os.environ, **stand_in_vllm}
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=900, check=False, env=env
    )
    assert done.returncode == 0, done.stderr[-3000:]
    # The first table (the second, after a blank line, says where the time went).
    rows = [line for line in done.stdout.split("\n\n")[0].splitlines() if line.startswith("| seqs")]
    found = [row.split(" | ")[:3] for row in rows]
    assert found == [["| seqs2", "1", "1"], ["| seqs4", "1", "1"]], (
        done.stdout + done.stderr[-3000:]
    )
    # Each arm's median TTFT p95 and engine start were measured, not left out.
    assert all("| - |" not in row for row in rows), rows
    again = subprocess.run(
        [*command, "--report"], capture_output=True, text=True, timeout=120, env=env
    )
    assert (
        again.returncode == 0
        and [r for r in again.stdout.splitlines() if r.startswith("| seqs")][:2] == rows
    )


@pytest.mark.parametrize(
    "path", sorted((REPO / "benchmarks" / "arms").glob("*.yaml")), ids=lambda p: p.name
)
def test_every_arms_file_in_the_repository_loads(path: Path) -> None:
    # Each is sent to a GPU as it is: a file that does not load costs a machine's minutes.
    arms = ab.load_arms(path, parse_spec({"model": "m", "dummy_model": None}))
    assert len(arms) >= 2 and len({a.name for a in arms}) == len(arms)
