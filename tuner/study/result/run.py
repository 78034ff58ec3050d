"""A run: trials added to a study and the configuration it answers written, step by step.

``Run`` takes an open study, the spec, the ``Workload`` every trial replays and the run's
``RunConfig`` (``tuner.study.result.run_config``: resolved once, read here as it is), and is
driven in four steps, each telling a ``Teller`` what it does as it goes:

- ``calibrate``: where the run's time scale is ``auto``, the rate the window is replayed at,
  measured once on vLLM's defaults and kept in the study; then the study's fingerprint checked
  against this run's (``tuner.study.trials.fingerprint``);
- ``add_trials``: the search, within the run's time budget, with the CUDA-graph capture range
  pinned after trial 0 where the spec leaves it to vLLM (``tuner.study.trials.search``);
- ``confirm``: the top configurations and the baseline measured again
  (``tuner.study.trials.confirm``);
- ``result``: the configuration chosen and written (``tuner.study.result.written``).

``measure`` takes one configuration as given, outside the search: an A/B's arm.

``tuner run`` builds one and prints what it tells; a benchmark drives one the same way, its
lines logged (``LogTeller``). The launcher is the caller's to close.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Mapping
from typing import Any, Protocol

import optuna
from optuna.trial import FrozenTrial

from tuner.engine import environment
from tuner.engine.handle import ServerHandle
from tuner.engine.launchers import Launcher
from tuner.errors import InputError, TunerError
from tuner.study.measure.trial import OnProgress, TrialSetup, run_trial
from tuner.study.plan.space import capture_pin
from tuner.study.plan.spec import StudySpec
from tuner.study.result.run_config import RunConfig
from tuner.study.result.written import Written, write_configuration
from tuner.study.setup import calibrate as calibration
from tuner.study.setup.objective import of_spec
from tuner.study.setup.prepare import Workload, open_loop_replay, replay_lines, trial_setup
from tuner.study.store.record import TrialRecord
from tuner.study.trials import confirm, fingerprint, layout_phase, search
from tuner.study.trials.budget import (
    ENGINE_START_GUESS_S,
    GPU_CONFIRM_SHARE,
    Budget,
    confirm_trials,
)
from tuner.study.trials.groups import Group, contender, groups, rank, ranked
from tuner.study.trials.workers import this_placement

logger = logging.getLogger(__name__)


class Teller(Protocol):
    """Who hears what a run does: its lines, each trial as it starts (and its engine once
    started) and ends, and where the running trial is (``progress``: None where nobody shows
    it)."""

    progress: OnProgress | None

    def say(self, line: str) -> None: ...

    def trial_started(self, number: int, engine_args: Mapping[str, Any]) -> None: ...

    def engine_started(self, server: ServerHandle) -> None: ...

    def trial_finished(self, trial: FrozenTrial) -> None: ...


class LogTeller:
    """A ``Teller`` that logs (``logging``, at INFO): for a run without a terminal of its own."""

    progress: OnProgress | None = None

    def say(self, line: str) -> None:
        logger.info("%s", line)

    def trial_started(self, number: int, engine_args: Mapping[str, Any]) -> None:
        logger.info("trial %d: %s", number, dict(engine_args))

    def engine_started(self, server: ServerHandle) -> None:
        logger.info("%s started (%s)", server.name, server.where)

    def trial_finished(self, trial: FrozenTrial) -> None:
        logger.info("trial %d: %s, value %s", trial.number, trial.state.name, trial.value)


class Run:
    """One run over ``study``: ``calibrate``, ``add_trials``, ``confirm`` and ``result``, in that
    order (``add_trials`` and ``confirm`` only with a ``launcher``, which starts vLLM: without
    one the run starts no engine, it only writes the result of the trials there). ``runner``
    measures a trial (``run_trial``, which starts vLLM)."""

    def __init__(
        self,
        study: optuna.Study,
        spec: StudySpec,
        workload: Workload,
        config: RunConfig,
        teller: Teller | None = None,
        *,
        launcher: Launcher | None = None,
        runner: search.TrialRunner = run_trial,
    ) -> None:
        self.study = study
        self.spec = spec
        self.workload = workload
        self.config = config
        self.launcher = launcher
        self.runner = runner
        self.tell: Teller = teller if teller is not None else LogTeller()
        self.n_trials = config.n_trials
        # Every trial's layout: the one given, else the study's kept one (InputError if the two,
        # or the spec's engine arguments, disagree).
        self.layout = layout_phase.run_layout(study, config.layout, spec.engine_args)
        measures = launcher is not None
        # Asked once a run, and only to add trials: a report may be written on another machine.
        self.machine = fingerprint.measured_on() if measures else {}
        self.budget_s = config.time_budget_s if measures else None
        self.budget = self._budget(self.budget_s)
        # Without a budget, the same plan with no end: what the run will take, told as it goes.
        self._eta = self._budget(math.inf) if measures and self.budget is None else None
        self._setup: TrialSetup | None = None

    @property
    def calibrates(self) -> bool:
        """Whether this run replays at a calibrated rate (``TimeScale.calibrates``)."""
        request_trace = self.workload.trace is not None
        return self.config.time_scale.calibrates(of_spec(self.spec), request_trace)

    def calibrate(self) -> Workload:
        """The workload every trial replays, once the study is checked to have been measured
        as this run measures (an ``InputError`` if not): where the run ``calibrates``, at the
        rate of the calibration the study holds, else of one measured now on vLLM's defaults
        and kept in the study (said, with the window it sets)."""
        if self.calibrates:
            trace, workload = self.workload.trace, self.workload
            assert trace is not None
            found = self._calibration()
            self.tell.say(found.describe())
            time_scale = self.config.time_scale.factor(found)
            replay = open_loop_replay(
                trace,
                workload.window_s,
                time_scale,
                workload.model.max_model_len,
                found.replay_s,
                self.spec.warm_prefix_cache,
            )
            for line in replay_lines(replay):
                self.tell.say(line)
            self.workload = dataclasses.replace(workload, replay=replay, time_scale=time_scale)
        measured = fingerprint.of_study(self.spec, self.workload.fingerprint(), self.machine)
        note = fingerprint.check_workload(self.study, measured)
        if note is not None:
            self.tell.say(note)
        return self.workload

    def add_trials(self) -> int:
        """The search: ``n_trials`` more trials (the baseline first in a new study), none
        started where it and the confirmation would end after the budget; how many ran."""
        spec, budget = self.spec, self.budget
        pinned = capture_pin(spec, environment.is_cpu_build())
        for key, value in pinned.items():
            self.tell.say(
                f"pinned after trial 0, so that trials share vLLM's compiles: {key}={value}"
            )
        if self.layout is not None and self.layout.args:
            self.tell.say(f"layout: every trial's server on {self.layout}")
        self._plan()

        def finished(trial: FrozenTrial) -> None:
            self.tell.trial_finished(trial)
            if self._eta is not None and trial.datetime_start and trial.datetime_complete:
                # The search spends a budget's seconds itself; the estimate's, it is told here.
                took = trial.datetime_complete - trial.datetime_start
                self._eta.spent(took.total_seconds())
            if budget is not None and len(budget.costs) < self.n_trials:
                self._plan()  # re-planned from the costs measured so far
            elif self._eta is not None and len(self._eta.costs) in (1, 2):
                self._plan()  # from the first trial's measured cost, then the later ones

        ran = search.run_study(
            self.study,
            spec,
            self.trial_setup(),
            self.config.run_dir,
            self.n_trials,
            on_trial=finished,
            runner=self.runner,
            on_start=self.tell.trial_started,
            budget=budget,
            pinned=pinned,
            measured_on=self.machine,
            layout=self.layout,
        )
        if ran < self.n_trials:
            self.tell.say(
                f"time budget: ran {ran} of {self.n_trials} trials, keeping the rest of it for "
                "the confirmation"
            )
        return ran

    def confirm(self) -> int:
        """The confirmation, where the spec asks for one: the search's finalist and the
        baseline on fresh engines in ABBA order (``tuner.study.trials.confirm``), then the
        spec's candidates where it confirms them; or, where no searched configuration met the
        SLOs, the baseline measured again so that its median is written. How many trials ran."""
        spec, say = self.spec, self.tell.say
        repeats = spec.confirm_repeats
        if not (spec.confirm_top_k and repeats):
            return 0
        served = groups(self.study)
        feasible, baseline, _ = rank(served)
        if not feasible:
            say(
                "not confirming: no configuration met the SLOs, and measuring vLLM's defaults "
                "again would not give one"
            )
            return 0
        state = confirm.current(self.study, repeats)
        if state is None:
            alone = baseline if baseline is not None and baseline.feasible else None
            return self._alone_again(alone, repeats) if alone is not None else 0
        away = confirm.elsewhere(state, this_placement())
        if away is not None:
            say(away)
            return 0
        if state.next_arm() is None:
            say(_decided(state, served))
            ran = 0
        else:
            name = _named(state.baseline)[0]
            finalist = f"trial {state.finalist.number}"
            finalist += TrialRecord.of(state.finalist.first).defaults_aside
            say(
                f"confirming the finalist, {finalist}, against {name}: "
                f"{repeats} fresh measurement{'s' if repeats != 1 else ''} each, in turns "
                f"(finalist, {name}, {name}, "
                f"finalist, ...), stopping at the first pair that favours {name}"
            )
            ran = confirm.confirm(
                self.study, self._measuring(), repeats, self.tell.trial_finished, self.budget
            )
            self._stopped_short(ran)
        if spec.confirm_candidates:
            ran += self._candidates_again(repeats)
        return ran

    def _measuring(self) -> search.Measuring:
        return search.Measuring(
            self.trial_setup(), self.config.run_dir, self.runner, self.machine,
            self.tell.trial_started, self.spec.lease_s,
        )  # fmt: skip

    def _candidates_again(self, repeats: int) -> int:
        """The spec's candidates other than the finalist, each measured ``repeats`` more times,
        as far as the budget allows, so that the answer is held against them."""
        ran = 0
        state = confirm.current(self.study, repeats)
        final = state.finalist.number if state is not None else None
        for group in ranked(self.study)[2]:
            if group.number == final:
                continue
            ran += confirm.again(
                self.study, group.number, self._measuring(), 1 + repeats,
                self.tell.trial_finished, self.budget,
            )  # fmt: skip
        return ran

    def _stopped_short(self, ran: int) -> None:
        """Where the time budget stopped the confirmation before its round was decided, say
        so: the baseline is then kept (no verdict from fewer fresh measurements)."""
        spec, budget = self.spec, self.budget
        if budget is None or budget.may_confirm():
            return
        state = confirm.current(self.study, spec.confirm_repeats)
        if state is None or state.next_arm() is None:
            return
        mine, theirs = len(state.finalist_fresh.trials), len(state.baseline_fresh.trials)
        self.tell.say(
            f"time budget: the confirmation stopped after {ran} fresh measurement"
            f"{'s' if ran != 1 else ''}, {max(budget.left_s, 0.0):.0f} s left of about "
            f"{budget.confirm_s:.0f} s each; the finalist measured {mine} and the baseline "
            f"{theirs} of the {spec.confirm_repeats} each asked for: the baseline is kept (no "
            "verdict from fewer; a larger --time-budget-s or --confirm-only confirms in full)"
        )

    def _alone_again(self, group: Group, repeats: int) -> int:
        """Where ``group`` alone met the SLOs (vLLM's defaults, as a rule) and was measured fewer
        than ``1 + repeats`` times, measure it again (said either way): what is written is then
        its median over fresh engines, not one engine's figures, as far as the budget allows."""
        (name, were), engines = _named(group), group.measured
        if engines >= 1 + repeats:
            self.tell.say(f"not confirming again: {name} {were} measured {engines} times already")
            return 0
        budget = self.budget
        if budget is not None and not budget.may_confirm():
            left_s = max(budget.left_s, 0.0)
            self.tell.say(
                f"not confirming: only {name} served, and the {left_s:.0f} s left hold no "
                f"measurement of it again (about {budget.confirm_s:.0f} s); what is written was "
                f"measured on {engines} engine{'s' if engines != 1 else ''}"
            )
            return 0
        more = 1 + repeats - engines
        self.tell.say(
            f"confirming {name}, the only configuration that served: measured up to {more} more "
            f"time{'s' if more != 1 else ''} on fresh engines, so that what is written is the "
            "median"
        )
        return confirm.again(
            self.study, group.number, self._measuring(), 1 + repeats,
            self.tell.trial_finished, budget,
        )  # fmt: skip

    def measure(self, engine_args: Mapping[str, Any]) -> FrozenTrial:
        """One configuration measured as given, on the server the launcher hands back (a fresh
        engine; ``tuner run --server-url``: the server at that URL, ``engine_args`` empty), as a
        trial of the study of its own: not drawn by the search, never pruned nor held to the
        best capacity so far (an arm of an A/B, which ``benchmarks/ab.py`` measures in turns).
        The trial is told as it starts and ends; an engine that fails is an infeasible trial,
        as in ``add_trials``. Only for a run with a launcher."""
        how = self._measuring()
        trial = self.study.ask()
        frozen = search.measure(self.study, trial, dict(engine_args), how, prunable=False)
        self.tell.trial_finished(frozen)
        return frozen

    def result(self) -> Written | None:
        """The configuration the study answers, written to ``config.config_path``
        (``write_configuration``); None where no trial served (nothing written)."""
        return write_configuration(self.study, self.spec, self.workload, self.config.config_path)

    def trial_setup(self) -> TrialSetup:
        """What every trial of this run shares; made once, and only for a run with a launcher."""
        if self._setup is None:
            launcher = self.launcher
            if launcher is None:
                raise ValueError("a run without a launcher measures nothing")
            vocab_size = self.workload.model.vocab_size
            setup = trial_setup(
                self.spec, self.config.criteria, self.workload.replay, vocab_size, launcher,
                self.tell.progress,
            )  # fmt: skip
            self._setup = dataclasses.replace(setup, on_engine_start=self.tell.engine_started)
        return self._setup

    def _budget(self, budget_s: float | None) -> Budget | None:
        """The run's time budget, counted from ``config.began``, with the confirm step's
        measurements held back from the start; None without one."""
        if budget_s is None:
            return None
        spec, replay = self.spec, self.workload.replay
        replay_s = replay.offered.replay_s if replay.offered is not None else spec.window_s
        estimate_s = ENGINE_START_GUESS_S + of_spec(spec).measure_s(spec, replay_s)
        candidates = len(spec.candidates) if spec.confirm_candidates else 0
        held = confirm_trials(spec.confirm_top_k, spec.confirm_repeats, candidates)
        held = max(0, held - self._fresh_taken()) if held else 0
        share = 1.0 if environment.is_cpu_build() else GPU_CONFIRM_SHARE
        return Budget(
            self.config.began + budget_s,
            confirm_trials=held,
            estimate_s=estimate_s,
            confirm_share=share,
            contender=contender(self.study),
            candidates=candidates,
        )

    def _fresh_taken(self) -> int:
        """The fresh measurements the study's confirmation round holds already: a continued
        study's confirmation measures only what its round still needs."""
        state = confirm.current(self.study, self.spec.confirm_repeats)
        return state.taken if state is not None else 0

    def _plan(self) -> None:
        """Say what the budget buys; without one, what the run will take."""
        spec = self.spec
        if self.budget is not None:
            ran = len(self.budget.costs)
            self.tell.say(self.budget.plan(self.n_trials, spec.confirm_repeats, ran))
        elif self._eta is not None and (left := self.n_trials - len(self._eta.costs)) > 0:
            self.tell.say(self._eta.eta(left, spec.confirm_repeats))

    def _calibration(self) -> calibration.Calibration:
        """The study's calibration: the one it holds, else measured now on vLLM's defaults (the
        study's baseline) and kept in the study. An ``InputError`` where there is none and this
        run starts no engine; a ``TunerError`` where vLLM's defaults did not serve."""
        study, spec, replay = self.study, self.spec, self.workload.replay
        held = calibration.stored(study.user_attrs)
        if held is not None:
            return held
        if self.launcher is None:
            raise InputError(
                f"study {study.study_name!r} has no calibration yet (time_scale: auto): run it "
                "with trials to measure one"
            )
        assert replay.offered is not None  # an open-loop window
        search_at = calibration.settings(
            replay.requests, replay.offered.replay_s, spec.calibrate_replay_s,
            spec.client_tolerance_s,
        )  # fmt: skip
        self.tell.say(
            "calibrating (time_scale: auto): how much of this window vLLM's defaults carry "
            f"within the SLOs on this machine, from {search_at.window_req_per_s:.3g} req/s, "
            f"{search_at.probe_s:g} s a rate, to within {search_at.resolution:.0%}"
        )
        vocab_size = self.workload.model.vocab_size
        setup = trial_setup(spec, self.config.criteria, replay, vocab_size, self.launcher)
        try:
            measured = calibration.measure(
                setup, search_at, spec, self.config.run_dir / "calibration"
            )
        except calibration.CalibrationFailed as exc:
            tail = f"\n{exc.log_tail}" if exc.log_tail else ""
            raise TunerError(
                f"calibration: vLLM's defaults did not serve: {exc.reason}{tail}"
            ) from None
        # Another worker of a shared study may have calibrated meanwhile: its calibration wins.
        held = calibration.stored(study.user_attrs)
        if held is not None:
            return held
        study.set_user_attr(calibration.CALIBRATION_ATTR, measured.as_attr())
        return measured


def _decided(state: confirm.Round, served: list[Group]) -> str:
    """Why a run confirms nothing more: the study's round is done; and where the search now
    ranks another configuration first, that a study confirms one finalist."""
    done = f"not confirming again: the confirmation of trial {state.finalist.number} is done"
    leader = confirm.finalist(served)
    if leader is None or leader.number == state.finalist.number:
        return done
    return (
        f"{done}; trial {leader.number} leads the search now, but a study holds one "
        "confirmation, so that continuing it never adds another chance of writing a "
        "configuration no better than the baseline: a new study, with it among its spec's "
        "candidates, confirms it"
    )


def _named(group: Group) -> tuple[str, str]:
    """A configuration by what it is, with its verb: ``("vLLM's defaults", "were")`` (or the
    spec's own baseline, ``("your configuration", "was")``) or ``("trial N", "was")``."""
    recorded = TrialRecord.of(group.first)
    if recorded.baseline:
        return recorded.baseline_name, "was" if recorded.spec_baseline else "were"
    return f"trial {group.number}", "was"
