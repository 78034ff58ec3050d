"""Which of a study's trials to show: the best single one (the pruner's reference), the
baseline, the first failure. Read-only over a study's trials; the search itself is
``tuner.study.trials.search``, and the configuration tuner writes is
``tuner.study.result.choice``'s."""

from __future__ import annotations

from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from tuner.study.setup.objective import of_trial
from tuner.study.store.record import TrialRecord


def engine_args_of(trial: FrozenTrial) -> dict[str, Any]:
    """The engine arguments the trial ran with (all of them, fixed and searched)."""
    return dict(TrialRecord.of(trial).engine_args)


def constraints_of(trial: FrozenTrial) -> dict[str, float]:
    """The constraints the trial was judged by when it was measured (above 0: missed)."""
    return dict(trial.constraints)


def served(trial: FrozenTrial) -> bool:
    """Whether the trial measured its whole window with figures to score.

    Not: a pruned, interrupted or running trial, nor one its objective says measured nothing
    to rank it by (``StudyObjective.served``: a latency trial scored ``FAILED_SCORE``, its
    engine failed or every request did; a capacity trial without a rate measured).
    """
    if trial.state != TrialState.COMPLETE or trial.value is None:
        return False
    return of_trial(trial).served(trial)


def best_trial(study: optuna.Study) -> FrozenTrial | None:
    """The best feasible completed trial, or None."""
    try:
        best = study.best_trial
    except ValueError:
        return None
    return best if TrialRecord.of(best).feasible else None


def first_failure(study: optuna.Study) -> FrozenTrial | None:
    """The first trial that failed: completed without serving (its engine failed), or
    interrupted. Pruned trials served until they were stopped: not failures."""
    return next(
        (
            t
            for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL))
            if not served(t)
        ),
        None,
    )


def baseline_trial(study: optuna.Study) -> FrozenTrial | None:
    """The study's first complete baseline trial (vLLM's defaults unless the spec says), if any."""
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        if TrialRecord.of(t).baseline:
            return t
    return None
