"""The study: Optuna asks for configurations, ``run_trial`` measures them.

Trial 0 of a study is the baseline, vLLM's own defaults (plus the spec's fixed and baseline
arguments). Every measured figure becomes a user attribute, every SLO a constraint set with
``Trial.set_constraint`` (both through ``tuner.study.store.record``), so optuna-dashboard
shows them and TPE learns the infeasible region.
"""

from __future__ import annotations

import contextlib
import logging
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, Trial, TrialState

from tuner.errors import InputError, TunerError
from tuner.flags import flag_name
from tuner.study.measure.trial import TrialOutcome, TrialSetup, run_trial
from tuner.study.plan.layouts import Layout
from tuner.study.plan.spec import INCUMBENT, Dimension, StudySpec
from tuner.study.setup.objective import LATENCY_OBJECTIVE, StudyObjective, of_spec, of_study
from tuner.study.store import record
from tuner.study.store.record import Queued, TrialRecord
from tuner.study.store.storage import (
    OPEN_ERRORS,
    OPEN_WAIT_S,
    STORAGE_ERRORS,
    abandon,
    cause,
    check_database_file,
    journal_path,
    open_failure,
    opening,
    storage_of,
)
from tuner.study.trials import fingerprint, groups, incumbent, references
from tuner.study.trials.budget import Budget, Parts
from tuner.study.trials.layout_phase import of_kept_layout
from tuner.study.trials.lease import LEASE_S, Lease
from tuner.study.trials.picks import best_trial
from tuner.study.trials.workers import fail_expired, this_placement, this_worker
from tuner.urls import shown_url

logger = logging.getLogger(__name__)

# Added to an infeasible trial's rank: any feasible trial is a better incumbent.
INFEASIBLE_RANK = 1e12

MAX_NUM_SEQS = flag_name("max_num_seqs")
MAX_BATCHED_TOKENS = flag_name("max_num_batched_tokens")

TrialRunner = Callable[..., TrialOutcome]
OnTrial = Callable[[FrozenTrial], None]
OnStart = Callable[[int, Mapping[str, Any]], None]


class FarOffPruner(optuna.pruners.BasePruner):
    """Stops a trial that is already far off, from its worst metric-to-SLO ratio so far.

    Far off: the ratio is above ``factor`` (a metric at ``factor`` times its SLO), or above
    ``factor`` times what the best feasible trial showed at the same point of its window. A
    request still waiting for its first token counts with its wait so far, so a queue that is
    blowing up crosses the line within seconds. Nothing is pruned before ``after_step``.
    """

    def __init__(self, factor: float, after_step: int) -> None:
        self.factor = factor
        self.after_step = after_step

    def prune(self, study: optuna.Study, trial: FrozenTrial) -> bool:
        step = trial.last_step
        if self.factor <= 0 or step is None or step < self.after_step:
            return False
        value = trial.intermediate_values[step]
        if value > self.factor:
            return True
        best = best_trial(study)
        if best is None:
            return False
        earlier = [s for s in best.intermediate_values if s <= step]
        return bool(earlier) and value > self.factor * best.intermediate_values[max(earlier)]


def open_study(
    name: str,
    storage: str | optuna.storages.BaseStorage,
    seed: int,
    pruner: optuna.pruners.BasePruner | None = None,
    objective: StudyObjective = LATENCY_OBJECTIVE,
    wait_s: float = OPEN_WAIT_S,
) -> optuna.Study:
    """Create the study or load it to add trials; the sampler's seed moves on with each trial.

    The study is created for ``objective`` (its direction, and its metric by name); a study
    created for another objective is refused. A storage that cannot be opened is a
    ``TunerError`` naming it and the cause, in one line.

    Processes opening studies in one database at once take turns (``storage.opening``), each
    waiting at most ``wait_s`` seconds for the others: so workers started together all start.

    A resumed study re-seeded with the same number would replay the same random start-up
    suggestions, so the seed is offset by the trials already there.
    """
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    existing = 0
    shown = storage if isinstance(storage, str) else type(storage).__name__
    url = storage.url if isinstance(storage, optuna.storages.RDBStorage) else storage
    if isinstance(url, str):
        check_database_file(url)
    turn = opening(url, wait_s) if isinstance(url, str) else contextlib.nullcontext()
    try:
        with turn:
            if isinstance(storage, str):
                storage = storage_of(storage)
            with contextlib.suppress(KeyError):
                loaded = optuna.load_study(study_name=name, storage=storage)
                existing = len(loaded.trials)
                made_for = of_study(loaded)
                if made_for is not objective:
                    raise InputError(
                        f"study {name!r} is a {made_for.mode} study (--objective "
                        f"{made_for.mode}); use --study NEWNAME to start a new one"
                    )
            # constant_liar: where TPE draws for several workers at once, trials still running
            # count as bad, so that two workers do not draw the same region.
            sampler = optuna.samplers.TPESampler(
                seed=seed + existing, multivariate=True, constant_liar=True
            )
            study = optuna.create_study(
                study_name=name,
                storage=storage,
                sampler=sampler,
                pruner=pruner or optuna.pruners.NopPruner(),
                direction=objective.direction,
                load_if_exists=True,
            )
            if study.metric_names is None:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                    study.set_metric_names([objective.metric])
    except OPEN_ERRORS as exc:
        raise TunerError(open_failure(shown, exc)) from None
    return study


def load_existing(name: str, storage: str) -> optuna.Study:
    """A study that is already there, to read; creates nothing (not even a SQLite file)."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    journal = journal_path(storage)
    path = str(journal) if journal is not None else storage.removeprefix("sqlite:///")
    if path != storage and not Path(path).exists():
        raise InputError(f"no study database at {path}")
    check_database_file(storage)
    try:
        opened = storage_of(storage) if journal is not None else storage
        return optuna.load_study(study_name=name, storage=opened)
    except OPEN_ERRORS as exc:
        raise TunerError(open_failure(storage, exc)) from None
    except KeyError:
        there = ", ".join(optuna.get_all_study_names(opened)) or "none"
        raise InputError(
            f"no study {name!r} in {shown_url(storage)} (studies there: {there})"
        ) from None


def suggest(trial: Trial, space: tuple[Dimension, ...], fixed: Mapping[str, Any]) -> dict[str, Any]:
    """Engine arguments for this trial, drawn from the space in the spec's order.

    max-num-batched-tokens is never drawn below max-num-seqs (vLLM rejects that).
    """
    args: dict[str, Any] = {}
    for dim in space:
        if dim.kind == "categorical":
            args[dim.name] = trial.suggest_categorical(dim.name, dim.choices)
            continue
        assert dim.low is not None and dim.high is not None
        low = dim.low
        if dim.name == MAX_BATCHED_TOKENS:
            seqs = args.get(MAX_NUM_SEQS, fixed.get(MAX_NUM_SEQS))
            if isinstance(seqs, int | float):
                low = max(low, seqs)
        if dim.kind == "int":
            args[dim.name] = trial.suggest_int(
                dim.name, int(low), int(dim.high), step=int(dim.step or 1), log=dim.log
            )
        else:
            value = trial.suggest_float(dim.name, low, dim.high, step=dim.step, log=dim.log)
            # Keep stepped floats free of binary noise (0.30000000000000004) in the YAML.
            args[dim.name] = round(value, 10)
    return args


def _next_trial(
    study: optuna.Study, spec: StudySpec, layout: Layout | None = None
) -> optuna.Trial | None:
    """The next trial: a queued reference (the baseline, a candidate, at ``layout``), else the
    incumbent search's move (``search: incumbent``), else the sampler's; None where it repeated
    a reference already measured (and was dropped)."""
    try:
        if not references.queue_next(study, spec, layout) and spec.search == INCUMBENT:
            queue_move(study, spec)
        trial = study.ask()
        record.claimed(trial, this_worker())
        original = references.duplicate_of(study, trial)
        if original is not None:
            references.drop_duplicate(study, trial, original)
            return None
    except STORAGE_ERRORS as exc:
        raise TunerError(f"the study's storage failed: {cause(exc)}") from exc
    return trial


def _trial_args(
    study: optuna.Study,
    trial: optuna.Trial,
    spec: StudySpec,
    fixed: dict[str, Any],
    pinned: dict[str, Any],
) -> dict[str, Any]:
    """The engine arguments of ``trial``; where they cannot be had (Ctrl-C, the storage), the
    trial is abandoned (``abandon``) before the error goes on."""
    try:
        return _arguments(trial, spec, fixed, pinned)
    except BaseException as exc:
        failure = abandon(study, trial, exc)
        if failure is None:
            raise
        raise failure from exc


def _arguments(
    trial: optuna.Trial, spec: StudySpec, fixed: dict[str, Any], pinned: dict[str, Any]
) -> dict[str, Any]:
    """The engine arguments of ``trial``: the baseline's as given, a candidate's dimensions as
    given (the others stay at vLLM's defaults), a searched trial's with the ``pinned`` ones."""
    queued = Queued.of(trial)
    if queued.baseline:
        return {**fixed, **spec.baseline}
    candidate = queued.candidate
    if candidate is not None:
        chosen = spec.candidates[candidate]
        dims = tuple(d for d in spec.space if d.name in chosen)
        return {**fixed, **suggest(trial, dims, fixed), **chosen}
    return {**fixed, **pinned, **suggest(trial, spec.space, fixed)}


def run_study(
    study: optuna.Study,
    spec: StudySpec,
    setup: TrialSetup,
    run_dir: Path,
    n_trials: int,
    on_trial: OnTrial | None = None,
    runner: TrialRunner = run_trial,
    on_start: OnStart | None = None,
    budget: Budget | None = None,
    pinned: Mapping[str, Any] | None = None,
    measured_on: Mapping[str, str] | None = None,
    layout: Layout | None = None,
) -> int:
    """Run ``n_trials`` more trials, the baseline first if the study has none yet; return how many.

    ``pinned`` engine arguments (``spec.capture_pin``: the CUDA-graph capture range) go into
    every searched trial, under what the trial draws; not into the baseline, which stays vLLM's
    defaults, nor into the spec's candidates, which are measured as given.

    ``measured_on`` (the vLLM version and device; by default this machine's) is recorded on each
    trial. At a ``layout``, every trial runs with its engine arguments, and the baseline and the
    candidates are that layout's (``tuner.study.trials.references``).

    With a ``budget``, no trial is started after the first unless it and the confirm step
    the budget holds back would end within it (``Budget.may_search``); each trial's cost is
    told to it, and whether the study now holds a contender for the confirm step.

    A configuration that fails is a completed, infeasible trial. Ctrl-C (or any escape) marks
    the running trial FAIL with the reason, so the storage never keeps a trial RUNNING; unless
    the storage itself failed for good, which the ``TunerError`` raised for it then says.
    """
    fixed = {**spec.engine_args, **(layout.args if layout is not None else {})}
    pinned = dict(pinned or {})
    machine = fingerprint.measured_on() if measured_on is None else measured_on
    done = 0
    while done < n_trials:
        if budget is not None and done and not budget.may_search():
            logger.info("time budget reached after %d trials", done)
            return done
        began = time.monotonic()
        trial = _next_trial(study, spec, layout)
        if trial is None:
            continue
        args = _trial_args(study, trial, spec, fixed, pinned)
        # The baseline and the candidates are reference points: measured in full, but their
        # ratios are reported too, for the pruner to compare with when one is best.
        queued = Queued.of(trial)
        prunable = not queued.reference
        how = Measuring(setup, run_dir, runner, machine, on_start, spec.lease_s)
        # A searched configuration, not a re-measurement: first at what it must carry to matter.
        gated = prunable and queued.confirms is None
        frozen = measure(study, trial, args, how, prunable, gated=gated)
        if budget is not None:
            budget.spent(time.monotonic() - began, parts=Parts.of(frozen))
            budget.contender = budget.contender or groups.contender(study)
        if on_trial is not None:
            on_trial(frozen)
        done += 1
    return n_trials


def _fail_left(study: optuna.Study) -> None:
    """Fail the trials other workers left, their lease run out (``fail_expired``)."""
    try:
        fail_expired(study)
    except STORAGE_ERRORS as exc:
        logger.warning("looking for trials other workers left failed: %s", cause(exc))


@dataclass(frozen=True)
class Measuring:
    """What measuring a trial takes besides its arguments: the setup, where its logs go, the
    runner, the machine recorded on it, who is told it starts, and the seconds of its lease
    (``tuner.study.trials.lease``)."""

    setup: TrialSetup
    run_dir: Path
    runner: TrialRunner = run_trial
    machine: Mapping[str, str] = field(default_factory=dict)
    on_start: OnStart | None = None
    lease_s: float = LEASE_S


def _gate(study: optuna.Study) -> float | None:
    """The bar a searched capacity trial is first measured against: the best median capacity so
    far (of a configuration's measurements, not its luckiest one; ``RateSearch.for_trial``
    replays one resolution step above it), or None before any is feasible."""
    best = next(iter(groups.ranked(study)[0]), None)
    return best.median if best is not None and best.median > 0 else None


def measure(
    study: optuna.Study,
    trial: Trial,
    args: Mapping[str, Any],
    how: Measuring,
    prunable: bool,
    gated: bool = False,
    compare_at: float | None = None,
) -> FrozenTrial:
    """Run the asked ``trial`` with ``args``, record what it measured and tell the study.

    ``gated``: a searched configuration, which the trial's measure may first hold to the best
    median so far (``Measure.for_trial``; a capacity trial replays the best median capacity
    first, and is pruned if it fails there: it cannot beat it). ``compare_at``: the baseline
    measured again in a confirmation, which a capacity trial also measures once at the
    finalist's capacity, where that is above its own (``Measure.for_trial``'s ``compare``).

    The trial holds a lease while it is measured (``Lease``); one that another worker failed
    meanwhile (its lease read as past) is left as that worker marked it.

    Once it is told, the trials whose lease ran out are failed (``fail_expired``).

    Any escape (Ctrl-C, a storage error) marks the trial FAIL with the reason first.
    """
    frozen = _measured(study, trial, args, how, prunable, gated, compare_at)
    _fail_left(study)
    return frozen


def _measured(
    study: optuna.Study,
    trial: Trial,
    args: Mapping[str, Any],
    how: Measuring,
    prunable: bool,
    gated: bool,
    compare_at: float | None,
) -> FrozenTrial:
    """``measure``'s trial measured, recorded and told."""
    try:
        record.started(trial, this_worker(), args, how.machine)
        record.placed(trial, this_placement())
        if how.on_start is not None:
            how.on_start(trial.number, args)
        setup = how.setup
        measure = setup.measure.for_trial(
            lambda: of_kept_layout(study, study.get_trials(deepcopy=False)),
            args,
            trial.params,
            gate=lambda: _gate(study) if gated else None,
            compare=lambda: compare_at,
        )
        setup = replace(setup, measure=measure)
        with Lease(study, trial, how.lease_s) as lease:
            outcome = how.runner(
                args,
                setup,
                how.run_dir / f"trial-{trial.number:04d}",
                should_stop=_should_stop(trial, prunable),
            )
        if lease.lost:
            return study.get_trials(deepcopy=False)[trial.number]
        record.measured(trial, outcome)
        if outcome.pruned:
            return study.tell(trial, state=TrialState.PRUNED)
        return study.tell(trial, outcome.score.value)
    except BaseException as exc:
        failure = abandon(study, trial, exc)
        if failure is None:
            raise
        raise failure from exc


def queue_move(study: optuna.Study, spec: StudySpec) -> None:
    """Queue the incumbent search's next configuration (``tuner.study.trials.incumbent``), if it has
    one; else the study's sampler draws the trial."""
    names = {d.name for d in spec.space}
    defaults = spec.vllm_defaults
    objective = of_study(study)
    # A measured configuration ranks by the median of its measurements (its first trial and
    # the confirm step's re-measurements), as the winner is chosen.
    medians = {t.number: (g.median, g.feasible) for g in groups.groups(study) for t in g.trials}
    taken = []
    for t in of_kept_layout(study, study.get_trials(deepcopy=False, states=references.TAKEN)):
        # What the trial set: its engine arguments, its queued values, its drawn ones.
        recorded = TrialRecord.of(t)
        values = {k: v for k, v in recorded.engine_args.items() if k in names}
        values |= t.system_attrs.get("fixed_params", {}) | t.params
        rank = None
        if recorded.value is not None:
            own = (recorded.value, recorded.feasible)
            value, feasible = medians.get(t.number, own)
            rank = objective.rank(value)
            if not feasible:
                rank += INFEASIBLE_RANK
        taken.append(incumbent.Taken(values, rank))
    rules = [(MAX_NUM_SEQS, MAX_BATCHED_TOKENS)]
    proposal = incumbent.next_point(spec.space, taken, defaults, rules)
    if proposal is not None:
        logger.info("next: %s (%s)", proposal.params, proposal.move)
        study.enqueue_trial(proposal.params, user_attrs=Queued(move=proposal.move).attrs())


def _should_stop(trial: Trial, prunable: bool) -> Callable[[int, float], bool]:
    """Report the window's worst SLO ratio at ``step``; stop if prunable and the pruner says so."""

    def should_stop(step: int, value: float) -> bool:
        trial.report(value, step)
        return prunable and trial.should_prune()

    return should_stop


def pruner_for(spec: StudySpec) -> FarOffPruner | None:
    """The spec's pruner, ``prune_factor`` after ``prune_after_s``; None where its objective
    prunes nothing."""
    if not of_spec(spec).prunes:
        return None
    return FarOffPruner(factor=spec.prune_factor, after_step=round(spec.prune_after_s))
