"""The reference points of a study, measured once in all: the baseline, then the candidates.

Several workers may run one study (one per GPU, on a shared PostgreSQL storage). The next
reference point not yet taken is queued (Optuna's ``enqueue_trial``) and taken by ``ask``, which
hands a queued trial to one worker only. Two workers that queue the same point at the same
moment both get a trial; the later one is a duplicate, marked FAIL without being measured. The
incumbent search's moves are held to the same rule: a move queued by two workers at once, whose
values another trial took already (waiting, running or measured), is a duplicate too.
"""

from __future__ import annotations

import optuna
from optuna.trial import Trial, TrialState

from tuner.study.plan.spec import StudySpec
from tuner.study.store import record
from tuner.study.store.record import Queued

# A reference point is taken by a trial in one of these states (a FAIL one is measured again).
TAKEN = (TrialState.WAITING, TrialState.RUNNING, TrialState.COMPLETE, TrialState.PRUNED)


def has_baseline(study: optuna.Study) -> bool:
    """Whether a baseline trial has completed in the study (so none is queued again)."""
    return any(
        Queued.of(t).baseline
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    )


def _point(queued: Queued) -> tuple[bool, int | None] | None:
    """The reference point a trial was queued to take (the baseline, or a candidate's index),
    or None for a trial that takes none."""
    if not queued.reference:
        return None
    return (True, None) if queued.baseline else (False, queued.candidate)


def _taken(study: optuna.Study) -> set[tuple[bool, int | None]]:
    points = (_point(Queued.of(t)) for t in study.get_trials(deepcopy=False, states=TAKEN))
    return {point for point in points if point is not None}


def next_candidate(study: optuna.Study, spec: StudySpec) -> int | None:
    """The first of the spec's candidates that no trial has taken, if any."""
    taken = _taken(study)
    return next((i for i in range(len(spec.candidates)) if (False, i) not in taken), None)


def queue_next(study: optuna.Study, spec: StudySpec) -> bool:
    """Queue the baseline if no trial has taken it, else the next candidate no trial has;
    whether one was queued."""
    if (True, None) not in _taken(study):
        queued = Queued(baseline=True, spec_baseline=spec.names_baseline)
        study.enqueue_trial({}, user_attrs=queued.attrs())
        return True
    index = next_candidate(study, spec)
    if index is None:
        return False
    names = {d.name for d in spec.space}
    params = {k: v for k, v in spec.candidates[index].items() if k in names}
    # Out-of-range values are kept (Optuna warns): the candidate is what it is.
    queued = Queued(candidate=index, defaults_candidate=index == spec.defaults_candidate)
    study.enqueue_trial(params, user_attrs=queued.attrs())
    return True


def duplicate_of(study: optuna.Study, trial: Trial) -> int | None:
    """The earlier trial that took the same reference point as ``trial``, or the same values of
    an incumbent search's move, if one did."""
    queued = Queued.of(trial)
    if queued.move is not None:
        return _same_move(study, trial)
    point = _point(queued)
    if point is None:
        return None
    earlier = [
        t.number
        for t in study.get_trials(deepcopy=False, states=TAKEN)
        if t.number < trial.number and _point(Queued.of(t)) == point
    ]
    return min(earlier, default=None)


def _same_move(study: optuna.Study, trial: Trial) -> int | None:
    """The earliest other trial that took every value ``trial``'s move queued."""
    taken = study.get_trials(deepcopy=False, states=TAKEN)
    own = next((t for t in taken if t.number == trial.number), None)
    values = dict(own.system_attrs.get("fixed_params") or {}) if own is not None else {}
    if not values:
        return None
    for other in taken:
        if other.number >= trial.number or Queued.of(other).confirms is not None:
            continue
        took = {**(other.system_attrs.get("fixed_params") or {}), **other.params}
        if all(key in took and took[key] == value for key, value in values.items()):
            return other.number
    return None


def drop_duplicate(study: optuna.Study, trial: Trial, original: int) -> None:
    """End ``trial`` unmeasured (FAIL, with why): trial ``original`` measures the same thing."""
    record.give_reason(trial, f"queued twice by two workers: trial {original} measures it")
    study.tell(trial, state=TrialState.FAIL)
