"""The study loop's own rules, on real Optuna studies and a stand-in trial runner.

The pruner: a trial far off (its worst metric-to-SLO ratio above ``factor``, or above ``factor``
times the best trial's at the same point) is stopped, never before ``after_step``; the baseline
and the spec's candidates report like any trial, so that the pruner can compare with them, but
are measured in full.
"""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from tuner.load.http import ReplaySettings
from tuner.study.scoring import score
from tuner.study.search import FarOffPruner, open_study, pruner_for, run_study
from tuner.study.spec import parse_spec
from tuner.study.trial import Objective, TrialOutcome, TrialSetup

SLOS = {"e2e_p99_s": 10.0}
WEIGHTS = {"e2e_p99_s": 1.0}


def in_memory(pruner: FarOffPruner) -> optuna.Study:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.create_study(direction="minimize", pruner=pruner)


def finished(study: optuna.Study, ratios: dict[int, float], value: float, feasible: bool) -> None:
    """A completed trial that reported ``ratios`` (step: worst SLO ratio) on its way."""
    trial = study.ask()
    trial.set_user_attr("feasible", feasible)
    for step, ratio in ratios.items():
        trial.report(ratio, step)
    study.tell(trial, value)


def stops_at(study: optuna.Study, ratios: dict[int, float]) -> int | None:
    """The step at which the pruner stops a trial reporting ``ratios``, or None."""
    trial = study.ask()
    for step, ratio in ratios.items():
        trial.report(ratio, step)
        if trial.should_prune():
            study.tell(trial, state=TrialState.PRUNED)
            return step
    study.tell(trial, 1.0)
    return None


def test_far_worse_than_the_best_at_the_same_step_is_pruned() -> None:
    study = in_memory(FarOffPruner(factor=3.0, after_step=10))
    # The baseline: best, feasible, with its ratios along the window.
    finished(study, {5: 0.5, 10: 0.6, 15: 0.5}, value=0.5, feasible=True)
    # 2.0 at step 10 is under the absolute line (3) but above 3 x 0.6 = 1.8.
    assert stops_at(study, {5: 2.0, 10: 2.0}) == 10
    # Within the factor at every step: measured in full.
    assert stops_at(study, {5: 1.7, 10: 1.7, 15: 1.4}) is None
    # Between the best's steps, compared with its last step before: 12 -> step 10 (0.6).
    assert stops_at(study, {12: 1.9}) == 12
    assert stops_at(study, {12: 1.7}) is None


def test_nothing_is_pruned_before_after_step() -> None:
    study = in_memory(FarOffPruner(factor=3.0, after_step=10))
    finished(study, {5: 0.5, 10: 0.6}, value=0.5, feasible=True)
    assert stops_at(study, {0: 50.0, 5: 50.0, 9: 50.0}) is None
    assert stops_at(study, {5: 50.0, 10: 50.0}) == 10


def test_the_absolute_rule_prunes_without_a_best_trial() -> None:
    study = in_memory(FarOffPruner(factor=3.0, after_step=10))
    assert stops_at(study, {10: 2.9, 15: 3.0}) is None  # no best: only ratio > factor counts
    assert stops_at(study, {10: 2.9, 15: 3.1}) == 15
    # An infeasible best is no reference either.
    finished(study, {10: 0.1}, value=0.01, feasible=False)
    assert stops_at(study, {10: 2.0}) is None


def test_factor_zero_prunes_nothing() -> None:
    study = in_memory(FarOffPruner(factor=0.0, after_step=0))
    finished(study, {5: 0.1}, value=0.1, feasible=True)
    assert stops_at(study, {5: 100.0, 10: 1000.0}) is None


# The study loop, with a stand-in runner that reports as ``run_trial`` does.

SPEC = {
    "model": "m",
    "dummy_model": None,
    "engine_args": {"load-format": "dummy"},
    "baseline": {"gpu-memory-utilization": 0.2},
    "candidates": [{"block-size": 16}],
    "search_space": {"max-num-seqs": {"type": "int", "low": 1, "high": 32}},
    "slos": SLOS,
    "objective": WEIGHTS,
    "prune_factor": 3.0,
    "prune_after_s": 10,
}


def stand_in_setup() -> TrialSetup:
    return TrialSetup(
        model="m",
        requests=(),
        replay=ReplaySettings(model="m", vocab_size=100),
        objective=Objective(slos=SLOS, weights=WEIGHTS),
    )


class Reporting:
    """A runner reporting ratios at steps 5, 10, 15, 20 as a window would (when it is given
    ``should_stop``); stopped if told.

    The baseline's ratio is 0.5; the candidate (block size 16) is hopeless, 20 x its SLO; searched
    trials are at 2.0, within the absolute line but 4 times the baseline's.
    """

    def __init__(self) -> None:
        self.told_stop: list[bool] = []

    def __call__(self, args, setup, workdir, should_stop=None) -> TrialOutcome:
        ratio = 20.0 if "block-size" in args else 0.5 if "max-num-seqs" not in args else 2.0
        for step in (5, 10, 15, 20):
            if should_stop is not None and should_stop(step, ratio):
                self.told_stop.append(True)
                metrics = {"e2e_p99_s": ratio * 10.0, "stopped_at_s": float(step)}
                judged = score(metrics, SLOS, WEIGHTS)
                return TrialOutcome(args, judged, metrics, {}, "far off", pruned=True)
        self.told_stop.append(False)
        metrics = {"e2e_p99_s": ratio * 10.0, "error_rate": 0.0}
        return TrialOutcome(args, score(metrics, SLOS, WEIGHTS), metrics, {})


def test_baseline_and_candidates_report_and_a_later_hopeless_trial_is_pruned(
    tmp_path: Path,
) -> None:
    spec = parse_spec(SPEC)
    storage = f"sqlite:///{tmp_path / 's.db'}"
    runner = Reporting()
    study = open_study("s", storage, 0, pruner_for(spec))
    run_study(study, spec, stand_in_setup(), tmp_path, 3, runner=runner)
    baseline, candidate, searched = optuna.load_study(study_name="s", storage=storage).trials
    assert baseline.user_attrs["baseline"] is True
    assert baseline.intermediate_values == {5: 0.5, 10: 0.5, 15: 0.5, 20: 0.5}
    assert baseline.state == TrialState.COMPLETE
    # The candidate is a reference point too: far off, yet measured in full, and recorded.
    assert candidate.user_attrs["candidate"] == 0
    assert candidate.intermediate_values == {5: 20.0, 10: 20.0, 15: 20.0, 20: 20.0}
    assert candidate.state == TrialState.COMPLETE
    # Searched: 2.0 is under the line of 3 x its SLO, but 4 times the baseline's at step 10.
    assert searched.state == TrialState.PRUNED
    assert searched.intermediate_values == {5: 2.0, 10: 2.0}
    assert runner.told_stop == [False, False, True]


@pytest.mark.parametrize("factor", [0.0, 5.0])
def test_no_trial_is_pruned_when_the_pruner_says_so(tmp_path: Path, factor: float) -> None:
    """With the pruner off (0), or a factor the searched trials stay within, all run in full."""
    spec = parse_spec(SPEC | {"prune_factor": factor})
    storage = f"sqlite:///{tmp_path / 's.db'}"
    runner = Reporting()
    run_study(
        open_study("s", storage, 0, pruner_for(spec)),
        spec,
        stand_in_setup(),
        tmp_path,
        3,
        runner=runner,
    )
    trials = optuna.load_study(study_name="s", storage=storage).trials
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 3
    assert runner.told_stop == [False, False, False]
