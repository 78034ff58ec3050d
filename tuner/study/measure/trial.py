"""One trial: one engine configuration, started, measured on the replay window, and stopped.

Whatever the configuration does (vLLM rejects an argument, runs out of memory, crashes, never
becomes healthy, errors on requests) comes back as a ``TrialOutcome``; only a bug in tuner, or
the user's Ctrl-C, escapes as an exception. While it runs, a trial tells ``TrialSetup.progress``
(if set) where it is, for a person watching.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from tuner.engine.handle import EngineFailed, ServerHandle
from tuner.engine.launchers import Launcher, ProcessLauncher
from tuner.engine.own_server import ServerCommand
from tuner.engine.process import Engine
from tuner.load.closed_loop import replay_closed_loop
from tuner.load.health import CLIENT_BEHIND, CLIENT_TOLERANCE_S
from tuner.load.http import ReplaySettings
from tuner.load.metrics import LiveRequest, ReplayResult, provisional, so_far
from tuner.load.priming import prime
from tuner.load.session import Monitor
from tuner.load.spread import replay
from tuner.study.measure.judge import Criteria, Judged, judge
from tuner.study.measure.scoring import FAILED, Score, worst_slo_ratio
from tuner.traces.concurrency import ClosedLoopPlan
from tuner.traces.model import Request

logger = logging.getLogger(__name__)

# Added to the study's seed for the warm-up's prompts: a prime, so no multiple of the capacity
# search's stride between its windows' seeds (``tuner.study.capacity.probes.SEED_STRIDE``,
# another prime) equals it, nor does 0 (the window of a latency trial).
WARMUP_SEED = 104_729

# A trial's phases, in the order it goes through them (the warm-up only if the spec asks).
STARTING = "starting"
WARMUP = "warm-up"
REPLAY = "replay"
RATE = "rate"  # a capacity trial's windows: "rate 2/10: 1.5 req/s"
STOPPING = "stopping vLLM"
# The seconds a trial times (``TrialOutcome.timings``; vLLM's start-up steps go by
# ``startup_`` and their names): its engine's start until healthy, the warm-up, the window
# (or a capacity trial's search), its engine's stop, and the whole trial.
ENGINE_START_S = "engine_healthy_s"
WARMUP_S = "warmup_s"
WINDOW_S = "window_s"
ENGINE_STOP_S = "engine_stop_s"
TRIAL_S = "trial_s"

# How often a pruned trial's partial score goes to the pruner; progress is told every tick of
# the replay's monitor (``ReplaySettings.monitor_interval_s``).
PRUNE_INTERVAL_S = 5.0


@dataclass(frozen=True)
class TrialProgress:
    """Where a running trial is: its phase and the seconds into it; in a warm-up or replay, also
    how long it sends requests for, requests done (of how many, when known beforehand) and the
    TTFT p95 of the first tokens received so far."""

    phase: str
    elapsed_s: float = 0.0
    sending_s: float | None = None
    done: int = 0
    total: int | None = None
    ttft_p95_s: float | None = None


OnProgress = Callable[[TrialProgress], None]


@dataclass(frozen=True)
class TrialSetup:
    """Everything a trial needs besides its engine arguments."""

    model: str
    requests: Sequence[Request]
    replay: ReplaySettings
    criteria: Criteria
    health_timeout_s: float = 900.0
    warmup_requests: Sequence[Request] = ()
    launcher: Launcher = field(default_factory=ProcessLauncher)
    # Set for a concurrency trace: replayed closed-loop instead of ``requests`` (not pruned).
    closed_loop: ClosedLoopPlan | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    # Told where the trial is: each phase as it begins, then about once a second.
    progress: OnProgress | None = None
    # Told the server's handle as soon as it has been launched, before it is healthy.
    on_engine_start: Callable[[ServerHandle], None] | None = None
    # How the trial measures on its running server: the window replayed once (the default),
    # or a capacity study's search of rates (``tuner.study.capacity.rate_search.RateSearch``).
    measure: Measure = field(default_factory=lambda: WindowReplay())
    client_tolerance_s: float = CLIENT_TOLERANCE_S
    # The user's own app, started by its command in place of vLLM's OpenAI server.
    server: ServerCommand | None = None

    def engine(
        self, engine_args: Mapping[str, Any], workdir: Path, env: Mapping[str, str]
    ) -> Engine:
        """The server of one trial: vLLM's OpenAI server, or the user's app."""
        if self.server is not None:
            return self.server.engine(self.model, engine_args, workdir, self.launcher, env)
        return Engine(self.model, engine_args, workdir, launcher=self.launcher, env=env)


@dataclass(frozen=True)
class TrialOutcome:
    """What one trial measured, whatever its configuration did: the arguments it ran, its
    ``Score``, its figures (``metrics``, client-side and vLLM's own) and phase times
    (``timings``), and where it is infeasible or was cut short, why (``reason``, with the
    engine log's tail where vLLM failed). ``run_trial`` returns one for every configuration;
    only a bug or Ctrl-C raises instead."""

    engine_args: Mapping[str, Any]
    score: Score
    metrics: Mapping[str, float]
    timings: Mapping[str, float]
    reason: str | None = None
    log_tail: str = ""
    # Stopped early by the study's pruner; the metrics are then the provisional ones.
    pruned: bool = False
    # What the engine's log says of its compile: ``compile_key``, ``compile_cache_hit``.
    compile_cache: Mapping[str, str | bool] = field(default_factory=dict)
    # A capacity trial's rates, each with what it measured, in the order measured.
    points: tuple[Mapping[str, Any], ...] = ()
    # A capacity trial's one window at another configuration's capacity (``compare_req_per_s``).
    compared: Mapping[str, Any] | None = None

    @property
    def feasible(self) -> bool:
        return self.score.feasible


@dataclass(frozen=True)
class Ended:
    """What a trial's engine left once measured: the phase times, whether vLLM could no longer
    serve, its log's tail, what it said of its compile, and the kernels it compiled during the
    window."""

    timings: dict[str, float]
    crashed: bool
    log_tail: str
    compiled: Mapping[str, str | bool]
    late: Mapping[str, float]


class Measure:
    """How a trial measures on its running server, and the outcome it makes of that.

    ``WindowReplay`` replays the window once; a capacity study's trials search rates
    (``tuner.study.capacity.rate_search.RateSearch``). ``run_trial`` starts the engine, hands it to
    ``run`` and builds the outcome with ``outcome``, or with ``failed`` where vLLM never served.
    """

    @property
    def env(self) -> Mapping[str, str]:
        """Environment the engine needs for this way of measuring."""
        return {}

    def describe(self) -> str | None:
        """What ``tuner run`` says of this way of measuring, if more than the window."""
        return None

    def for_trial(
        self,
        trials: Callable[[], Sequence[Any]],
        args: Mapping[str, Any],
        params: Mapping[str, Any],
        gate: Callable[[], float | None],
        compare: Callable[[], float | None] = lambda: None,
    ) -> Measure:
        """This measure for one trial of a study (``trials()``: those so far; ``args`` and
        ``params``: the trial's engine arguments and searched values; ``gate()``: the bar a
        searched configuration must pass; ``compare()``: the rate at which vLLM's defaults,
        measured again, are also measured once, the leading configuration's). They are read
        only by a measure that uses them, so a window replay costs the study's storage
        nothing."""
        return self

    def run(self, base_url: str, setup: TrialSetup, should_stop: ShouldStop | None) -> Any:
        raise NotImplementedError

    def outcome(
        self, engine_args: Mapping[str, Any], setup: TrialSetup, measured: Any, ended: Ended
    ) -> TrialOutcome:
        raise NotImplementedError

    def failed(self, engine_args: Mapping[str, Any], exc: EngineFailed) -> TrialOutcome:
        """A configuration vLLM did not run (it exited, never became healthy): infeasible."""
        return TrialOutcome(engine_args, FAILED, {}, {}, exc.reason, exc.log_tail)


def _why_infeasible(outcome_score: Score, metrics: Mapping[str, float]) -> str | None:
    if outcome_score.feasible:
        return None
    missed = []
    for name in outcome_score.violations:
        if name == "error_rate":
            missed.append(f"error rate {metrics.get('error_rate', 1.0):.0%}")
        else:
            metric = name.removeprefix("slo_")
            value = metrics.get(metric)
            shown = "not measured" if value is None else f"{value * 1000:.0f} ms"
            missed.append(f"{metric} {shown}")
    return "SLO missed: " + ", ".join(missed)


# Told the step (whole seconds into the window) and the worst metric-to-SLO ratio so far (a
# request still waiting counting with its wait so far); True stops the trial.
ShouldStop = Callable[[int, float], bool]


def _monitor(
    criteria: Criteria,
    should_stop: ShouldStop | None,
    progress: OnProgress | None,
    start: TrialProgress,
) -> Monitor | None:
    """The replay's hook: progress at every tick, the pruner every ``PRUNE_INTERVAL_S``."""
    if should_stop is None and progress is None:
        return None
    due_s = PRUNE_INTERVAL_S

    def monitor(elapsed_s: float, live: Sequence[LiveRequest]) -> bool:
        nonlocal due_s
        if progress is not None:
            done, ttft_p95_s = so_far(live)
            progress(replace(start, elapsed_s=elapsed_s, done=done, ttft_p95_s=ttft_p95_s))
        if should_stop is None or not live or elapsed_s < due_s:
            return False
        while due_s <= elapsed_s:
            due_s += PRUNE_INTERVAL_S
        value = worst_slo_ratio(provisional(elapsed_s, live), criteria.slos)
        return should_stop(round(elapsed_s), value)

    return monitor


def _sending(phase: str, requests: Sequence[Request]) -> TrialProgress:
    """The start of an open-loop replay of ``requests``: how long it sends for, and how many."""
    return TrialProgress(
        phase, sending_s=requests[-1].arrival_s if requests else 0.0, total=len(requests)
    )


def _stopped_early(
    engine_args: Mapping[str, Any],
    setup: TrialSetup,
    judged: Judged,
    timings: dict[str, float],
) -> TrialOutcome:
    """The outcome of a trial its pruner stopped: provisional figures, infeasible if they say so."""
    assert judged.stopped_at_s is not None
    metrics = judged.figures
    shown = ", ".join(
        f"{m} >= {metrics[m]:.2f} s (SLO {limit:g} s)"
        for m, limit in setup.criteria.slos.items()
        if m in metrics
    )
    reason = f"stopped {judged.stopped_at_s:.0f} s into the window, far off: {shown}"
    return TrialOutcome(engine_args, judged.score, metrics, timings, reason, pruned=True)


def run_trial(
    engine_args: Mapping[str, Any],
    setup: TrialSetup,
    workdir: Path,
    should_stop: ShouldStop | None = None,
) -> TrialOutcome:
    """Start vLLM with ``engine_args``, replay the window, stop vLLM, score what was measured.

    With ``should_stop``, the window's worst SLO ratio is offered every few seconds and the trial
    ends early when it answers True (a hopeless queue costs seconds, not the whole window).
    """
    progress = setup.progress
    env = {**setup.env, **setup.measure.env}
    engine = setup.engine(engine_args, workdir, env)
    timings: dict[str, float] = {}
    began = time.monotonic()

    def tell(phase: TrialProgress) -> None:
        _tell(progress, phase)

    def starting(elapsed_s: float) -> None:
        tell(TrialProgress(STARTING, elapsed_s))

    try:
        tell(TrialProgress(STARTING))
        handle = engine.start()
        if setup.on_engine_start is not None:
            setup.on_engine_start(handle)
        timings[ENGINE_START_S] = engine.wait_healthy(setup.health_timeout_s, on_poll=starting)
        timings |= {f"startup_{k}": v for k, v in engine.times.startup.items()}
        compiled = engine.compile_cache()
        warmup_at = engine.mark()
        if setup.warmup_requests:
            timings[WARMUP_S] = _warm_up(engine.base_url, setup)
        started = time.monotonic()
        window_at = engine.mark()
        measured = setup.measure.run(engine.base_url, setup, should_stop)
        timings[WINDOW_S] = time.monotonic() - started
        late = engine.late_compiles(warmup_at, window_at)
        crashed = not engine.alive()
        tell(TrialProgress(STOPPING))
    except EngineFailed as exc:
        tell(TrialProgress(STOPPING))
        engine.stop()
        timings[ENGINE_STOP_S] = engine.times.stop_s or 0.0
        timings[TRIAL_S] = time.monotonic() - began
        logger.info("trial failed: %s", exc.reason)
        outcome = setup.measure.failed(engine_args, exc)
        return replace(outcome, timings=timings, compile_cache=engine.compile_cache())
    finally:
        # Also on Ctrl-C: the engine never outlives its trial.
        engine.stop()
    timings[ENGINE_STOP_S] = engine.times.stop_s or 0.0
    timings[TRIAL_S] = time.monotonic() - began
    ended = Ended(timings, crashed, engine.log_tail() if crashed else "", compiled, late)
    return setup.measure.outcome(engine_args, setup, measured, ended)


def _tell(progress: OnProgress | None, phase: TrialProgress) -> None:
    """Tell ``progress``, if anyone listens, where the trial is."""
    if progress is not None:
        progress(phase)


def _warm_up(base_url: str, setup: TrialSetup) -> float:
    """Replay the spec's warm-up requests, unscored; the seconds it took. They are the window's
    first requests, drawn from a seed of their own (``WARMUP_SEED``): with the window's, the
    window's first prompts would be found whole in the prefix cache. Blocks the trace sent
    before the window keep theirs (``ReplaySettings.history_seed``): those a server holds."""
    warmup = _sending(WARMUP, setup.warmup_requests)
    _tell(setup.progress, warmup)
    started = time.monotonic()
    watch = _monitor(setup.criteria, None, setup.progress, warmup)
    settings = replace(setup.replay, seed=setup.replay.seed + WARMUP_SEED)
    replay(base_url, setup.warmup_requests, settings, monitor=watch)
    return time.monotonic() - started


def _replay_outcome(
    engine_args: Mapping[str, Any],
    judged: Judged,
    late: Mapping[str, float],
    crashed: bool,
    crash_tail: str,
) -> TrialOutcome:
    """A replayed window's outcome: its figures scored against the SLOs, and why it is
    infeasible or not to be trusted (tuner's client behind, vLLM gone, requests failed)."""
    metrics = judged.figures | dict(late)
    trial_score = judged.score
    reason = _why_infeasible(trial_score, metrics)
    if behind := judged.client_behind:
        # Not the configuration's figures: infeasible, so never ranked (the dashboard shows why).
        metrics[CLIENT_BEHIND] = 1.0
        trial_score = Score(trial_score.value, {**trial_score.constraints, CLIENT_BEHIND: 1.0})
        reason = behind if reason is None else f"{behind}; {reason}"
    log_tail = ""
    if crashed:
        reason = "vLLM exited during the window; " + (reason or "")
        log_tail = crash_tail
    if judged.errors:
        reason = f"{reason or 'some requests failed'}; first error: {judged.errors[0]}"
    return TrialOutcome(engine_args, trial_score, metrics, {}, reason, log_tail)


class WindowReplay(Measure):
    """The window replayed once: closed-loop for a concurrency trace, else open-loop, on a
    prefix cache primed with the blocks the trace sent before the window; stopped early where
    ``should_stop`` (the pruner) says so."""

    def run(self, base_url: str, setup: TrialSetup, should_stop: ShouldStop | None) -> ReplayResult:
        progress = setup.progress
        if setup.closed_loop is not None:
            window = TrialProgress(REPLAY, sending_s=setup.closed_loop.schedule.end_s)
            _tell(progress, window)
            return replay_closed_loop(
                base_url,
                setup.closed_loop.schedule,
                setup.closed_loop.requests(setup.replay.seed),
                setup.replay,
                monitor=_monitor(setup.criteria, should_stop, progress, window),
            )
        prime(base_url, setup.requests, setup.replay)
        window = _sending(REPLAY, setup.requests)
        _tell(progress, window)
        watch = _monitor(setup.criteria, should_stop, progress, window)
        return replay(base_url, setup.requests, setup.replay, monitor=watch)

    def outcome(
        self,
        engine_args: Mapping[str, Any],
        setup: TrialSetup,
        measured: ReplayResult,
        ended: Ended,
    ) -> TrialOutcome:
        judged = judge(measured, setup.criteria, setup.client_tolerance_s)
        if judged.stopped_at_s is not None:
            stopped = _stopped_early(engine_args, setup, judged, ended.timings)
            metrics = {**stopped.metrics, **ended.late}
            return replace(stopped, metrics=metrics, compile_cache=ended.compiled)
        outcome = _replay_outcome(engine_args, judged, ended.late, ended.crashed, ended.log_tail)
        return replace(outcome, timings=ended.timings, compile_cache=ended.compiled)
