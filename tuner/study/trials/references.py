"""The reference points of a study, measured once in all: the baseline, then the candidates;
once per layout where a study measures several (``tuner.study.plan.layouts``: a run on a layout
other than vLLM's default queues its own, ``Queued.layout``). A baseline whose engine failed
(completed without serving) is started once more (``BASELINE_STARTS``): every verdict is a test
against it, and one failed start would otherwise leave the study without one.

Several workers may run one study (one per GPU, on a shared PostgreSQL storage). The next
reference point not yet taken is queued (Optuna's ``enqueue_trial``) and taken by ``ask``, which
hands a queued trial to one worker only. Two workers that queue the same point at the same
moment both get a trial; the later one is a duplicate, marked FAIL without being measured. The
incumbent search's moves are held to the same rule: a move queued by two workers at once, whose
values another trial took already (waiting, running or measured), is a duplicate too.
"""

from __future__ import annotations

import optuna
from optuna.trial import FrozenTrial, Trial, TrialState

from tuner.study.plan.layouts import Layout
from tuner.study.plan.spec import StudySpec
from tuner.study.store import record
from tuner.study.store.record import Queued
from tuner.study.trials.picks import served

# A reference point is taken by a trial in one of these states (a FAIL one is measured again).
TAKEN = (TrialState.WAITING, TrialState.RUNNING, TrialState.COMPLETE, TrialState.PRUNED)
# The baseline's starts, at most, where each completes without serving (its engine failed).
BASELINE_STARTS = 2


def has_baseline(study: optuna.Study) -> bool:
    """Whether a baseline trial has completed in the study (so none is queued again)."""
    return any(
        Queued.of(t).baseline
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    )


Point = tuple[bool, int | None, str | None]


def _point(queued: Queued) -> Point | None:
    """The reference point a trial was queued to take (the baseline, or a candidate's index, at
    its layout), or None for a trial that takes none."""
    if not queued.reference:
        return None
    if queued.baseline:
        return (True, None, queued.layout)
    return (False, queued.candidate, queued.layout)


def _failed(trial: FrozenTrial) -> bool:
    """Whether ``trial`` completed without serving: its engine failed, nothing was measured."""
    return trial.state == TrialState.COMPLETE and not served(trial)


def _taken(study: optuna.Study) -> set[Point]:
    """The reference points taken: by a trial that did not fail, or (the baseline) by
    ``BASELINE_STARTS`` trials that all did."""
    starts: dict[Point, int] = {}
    taken: set[Point] = set()
    for trial in study.get_trials(deepcopy=False, states=TAKEN):
        point = _point(Queued.of(trial))
        if point is None:
            continue
        starts[point] = starts.get(point, 0) + 1
        baseline = point[0]
        if not (baseline and _failed(trial)) or starts[point] >= BASELINE_STARTS:
            taken.add(point)
    return taken


def layout_name(layout: Layout | None) -> str | None:
    """How a reference point names its layout: None for vLLM's default one (and for none)."""
    return layout.name if layout is not None and layout.args else None


def baseline_taken(study: optuna.Study, layout: Layout | None = None) -> bool:
    """Whether a trial took the baseline at ``layout`` (waiting, running or measured)."""
    return (True, None, layout_name(layout)) in _taken(study)


def next_candidate(
    study: optuna.Study, spec: StudySpec, layout: Layout | None = None
) -> int | None:
    """The first of the spec's candidates that no trial has taken at ``layout``, if any."""
    taken, at = _taken(study), layout_name(layout)
    return next((i for i in range(len(spec.candidates)) if (False, i, at) not in taken), None)


def queue_next(study: optuna.Study, spec: StudySpec, layout: Layout | None = None) -> bool:
    """Queue the baseline if no trial has taken it (at ``layout``), else the next candidate no
    trial has; whether one was queued."""
    at = layout_name(layout)
    if not baseline_taken(study, layout):
        queued = Queued(baseline=True, spec_baseline=spec.names_baseline, layout=at)
        study.enqueue_trial({}, user_attrs=queued.attrs())
        return True
    index = next_candidate(study, spec, layout)
    if index is None:
        return False
    names = {d.name for d in spec.space}
    params = {k: v for k, v in spec.candidates[index].items() if k in names}
    # Out-of-range values are kept (Optuna warns): the candidate is what it is.
    queued = Queued(candidate=index, defaults_candidate=index == spec.defaults_candidate, layout=at)
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
    # A baseline that failed measured nothing: its second start duplicates nothing.
    earlier = [
        t.number
        for t in study.get_trials(deepcopy=False, states=TAKEN)
        if t.number < trial.number
        and _point(Queued.of(t)) == point
        and not (point[0] and _failed(t))
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
