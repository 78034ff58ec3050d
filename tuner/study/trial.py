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

from tuner.engine.launchers import EngineFailed, Launcher, ProcessLauncher, tail
from tuner.engine.process import Engine
from tuner.load.closed_loop import replay_closed_loop
from tuner.load.health import CLIENT_BEHIND, CLIENT_TOLERANCE_S, client_behind
from tuner.load.http import ReplaySettings
from tuner.load.metrics import LiveRequest, provisional, so_far
from tuner.load.spread import replay
from tuner.load.window import Monitor, ReplayResult, replay_figures
from tuner.study.capacity import (
    BELOW_ATTR,
    CAPACITY_ATTR,
    CAPACITY_FAILED,
    CapacitySettings,
    capacity_score,
    measure_capacity,
)
from tuner.study.rates import CapacityFound
from tuner.study.scoring import FAILED, Score, score, worst_slo_ratio
from tuner.traces.concurrency import ClosedLoop
from tuner.traces.model import Request

logger = logging.getLogger(__name__)

# A trial's phases, in the order it goes through them (the warm-up only if the spec asks).
STARTING = "starting vLLM"
WARMUP = "warm-up"
REPLAY = "replay"
RATE = "rate"  # a capacity trial's windows: "rate 2/10: 1.5 req/s"
STOPPING = "stopping vLLM"

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
class Objective:
    """How a trial is judged: SLOs in seconds, weights, and the errors it may have."""

    slos: Mapping[str, float]
    weights: Mapping[str, float]
    max_error_rate: float = 0.0


@dataclass(frozen=True)
class TrialSetup:
    """Everything a trial needs besides its engine arguments."""

    model: str
    requests: Sequence[Request]
    replay: ReplaySettings
    objective: Objective
    health_timeout_s: float = 900.0
    warmup_requests: Sequence[Request] = ()
    launcher: Launcher = field(default_factory=ProcessLauncher)
    # Set for a concurrency trace: replayed closed-loop instead of ``requests`` (not pruned).
    closed_loop: ClosedLoop | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    # Told where the trial is: each phase as it begins, then about once a second.
    progress: OnProgress | None = None
    # Set for a capacity study: the trial searches the highest rate that meets the SLOs.
    capacity: CapacitySettings | None = None
    client_tolerance_s: float = CLIENT_TOLERANCE_S


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

    @property
    def feasible(self) -> bool:
        return self.score.feasible


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
    objective: Objective,
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
        value = worst_slo_ratio(provisional(elapsed_s, live), objective.slos)
        return should_stop(round(elapsed_s), value)

    return monitor


def _search_capacity(base_url: str, setup: TrialSetup, settings: CapacitySettings) -> CapacityFound:
    """The capacity search on the running server, telling progress as each rate replays."""
    progress = setup.progress

    def on_rate(index: int, rate: float, elapsed_s: float, live: Sequence[LiveRequest]) -> None:
        if progress is not None:
            done, ttft_p95_s = so_far(live)
            phase = f"{RATE} {index + 1}/{settings.max_windows}: {rate:.3g} req/s"
            progress(
                TrialProgress(phase, elapsed_s, settings.rate_window_s, done, None, ttft_p95_s)
            )

    objective = setup.objective
    return measure_capacity(
        base_url, settings, setup.replay, objective.slos, objective.weights, on_rate
    )


def _capacity_outcome(
    engine_args: Mapping[str, Any],
    found: CapacityFound,
    timings: dict[str, float],
    crashed: bool,
    engine: Engine,
    compiled: Mapping[str, str | bool],
) -> TrialOutcome:
    """A capacity trial: its value the capacity; its figures those at the capacity (or at the
    lowest rate tried, if none passed); every rate measured as a point."""
    shown = found.best_point or found.lowest_point
    metrics = dict(shown.figures) if shown is not None else {}
    metrics[CAPACITY_ATTR] = found.capacity_req_per_s
    metrics["capacity_resolved"] = float(found.resolved)
    metrics["capacity_windows"] = float(len(found.points))
    if found.points:  # a hint (tuner.study.capacity.start_hint) or the window's rate
        metrics["capacity_start_req_per_s"] = found.points[0].rate_req_per_s
    reason = None if found.capacity_req_per_s > 0 else f"no rate met the SLOs: {found.why_stopped}"
    below = False
    if found.below_req_per_s is not None and not crashed:
        # Stopped at its gate: below the best so far, by how much not measured.
        below = True
        del metrics[CAPACITY_ATTR]
        metrics[BELOW_ATTR] = found.below_req_per_s
        reason = found.why_stopped
    log_tail = ""
    if crashed:
        reason = "vLLM exited during the search; " + (reason or "")
        log_tail = tail(engine.log_path)
    points = tuple(p.as_attr() for p in found.points)
    return TrialOutcome(
        engine_args,
        capacity_score(found.capacity_req_per_s),
        metrics,
        timings,
        reason,
        log_tail,
        compile_cache=compiled,
        points=points,
        pruned=below,
    )


def _sending(phase: str, requests: Sequence[Request]) -> TrialProgress:
    """The start of an open-loop replay of ``requests``: how long it sends for, and how many."""
    return TrialProgress(
        phase, sending_s=requests[-1].arrival_s if requests else 0.0, total=len(requests)
    )


def _stopped_early(
    engine_args: Mapping[str, Any],
    setup: TrialSetup,
    result: ReplayResult,
    timings: dict[str, float],
) -> TrialOutcome:
    """The outcome of a trial its pruner stopped: provisional figures, infeasible if they say so."""
    assert result.stopped_at_s is not None
    metrics = provisional(result.stopped_at_s, result.live)
    metrics["stopped_at_s"] = result.stopped_at_s
    objective = setup.objective
    trial_score = score(metrics, objective.slos, objective.weights)
    shown = ", ".join(
        f"{m} >= {metrics[m]:.2f} s (SLO {limit:g} s)"
        for m, limit in objective.slos.items()
        if m in metrics
    )
    reason = f"stopped {result.stopped_at_s:.0f} s into the window, far off: {shown}"
    return TrialOutcome(engine_args, trial_score, metrics, timings, reason, pruned=True)


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
    engine = Engine(setup.model, engine_args, workdir, launcher=setup.launcher, env=setup.env)
    timings: dict[str, float] = {}
    began = time.monotonic()

    def tell(phase: TrialProgress) -> None:
        _tell(progress, phase)

    def starting(elapsed_s: float) -> None:
        tell(TrialProgress(STARTING, elapsed_s))

    try:
        tell(TrialProgress(STARTING))
        engine.start()
        timings["engine_healthy_s"] = engine.wait_healthy(setup.health_timeout_s, on_poll=starting)
        timings |= {f"startup_{k}": v for k, v in engine.times.startup.items()}
        compiled = engine.compile_cache()
        warmup_at = engine.log_size()
        if setup.warmup_requests:
            timings["warmup_s"] = _warm_up(engine.base_url, setup)
        started = time.monotonic()
        window_at = engine.log_size()
        measured = _measure(engine.base_url, setup, should_stop)
        timings["window_s"] = time.monotonic() - started
        late = engine.late_compiles(warmup_at, window_at)
        crashed = not engine.alive()
        tell(TrialProgress(STOPPING))
    except EngineFailed as exc:
        tell(TrialProgress(STOPPING))
        engine.stop()
        timings["engine_stop_s"] = engine.times.stop_s or 0.0
        timings["trial_s"] = time.monotonic() - began
        logger.info("trial failed: %s", exc.reason)
        outcome = _failed(engine_args, setup.capacity is not None, exc)
        return replace(outcome, timings=timings, compile_cache=engine.compile_cache())
    finally:
        # Also on Ctrl-C: the engine never outlives its trial.
        engine.stop()
    timings["engine_stop_s"] = engine.times.stop_s or 0.0
    timings["trial_s"] = time.monotonic() - began
    if isinstance(measured, CapacityFound):
        return _capacity_outcome(engine_args, measured, timings, crashed, engine, compiled)
    if measured.stopped_at_s is not None:
        stopped = _stopped_early(engine_args, setup, measured, timings)
        return replace(stopped, metrics={**stopped.metrics, **late}, compile_cache=compiled)
    outcome = _replay_outcome(engine_args, setup, measured, late, crashed, engine.log_path)
    return replace(outcome, timings=timings, compile_cache=compiled)


def _failed(engine_args: Mapping[str, Any], capacity: bool, exc: EngineFailed) -> TrialOutcome:
    """A configuration vLLM did not run (it exited, never became healthy): infeasible, and in a
    capacity study a capacity of 0."""
    return TrialOutcome(
        engine_args,
        CAPACITY_FAILED if capacity else FAILED,
        {CAPACITY_ATTR: 0.0} if capacity else {},
        {},
        exc.reason,
        exc.log_tail,
    )


def _tell(progress: OnProgress | None, phase: TrialProgress) -> None:
    """Tell ``progress``, if anyone listens, where the trial is."""
    if progress is not None:
        progress(phase)


def _warm_up(base_url: str, setup: TrialSetup) -> float:
    """Replay the spec's warm-up requests, unscored; the seconds it took."""
    warmup = _sending(WARMUP, setup.warmup_requests)
    _tell(setup.progress, warmup)
    started = time.monotonic()
    watch = _monitor(setup.objective, None, setup.progress, warmup)
    replay(base_url, setup.warmup_requests, setup.replay, monitor=watch)
    return time.monotonic() - started


def _measure(
    base_url: str, setup: TrialSetup, should_stop: ShouldStop | None
) -> CapacityFound | ReplayResult:
    """What the trial measures on the running server: a capacity search, a closed-loop
    schedule, or the open-loop window (the last two stopped early by ``should_stop``)."""
    if setup.capacity is not None:
        return _search_capacity(base_url, setup, setup.capacity)
    progress = setup.progress
    if setup.closed_loop is not None:
        window = TrialProgress(REPLAY, sending_s=setup.closed_loop.schedule.end_s)
        _tell(progress, window)
        return replay_closed_loop(
            base_url,
            setup.closed_loop.schedule,
            setup.closed_loop.requests(setup.replay.seed),
            setup.replay,
            monitor=_monitor(setup.objective, should_stop, progress, window),
        )
    window = _sending(REPLAY, setup.requests)
    _tell(progress, window)
    watch = _monitor(setup.objective, should_stop, progress, window)
    return replay(base_url, setup.requests, setup.replay, monitor=watch)


def _replay_outcome(
    engine_args: Mapping[str, Any],
    setup: TrialSetup,
    result: ReplayResult,
    late: Mapping[str, float],
    crashed: bool,
    log_path: Path,
) -> TrialOutcome:
    """A replayed window's outcome: its figures scored against the SLOs, and why it is
    infeasible or not to be trusted (tuner's client behind, vLLM gone, requests failed)."""
    metrics = replay_figures(result) | dict(late)
    objective = setup.objective
    trial_score = score(metrics, objective.slos, objective.weights, objective.max_error_rate)
    reason = _why_infeasible(trial_score, metrics)
    if behind := client_behind(metrics, setup.client_tolerance_s):
        # Not the configuration's figures: infeasible, so never ranked (the dashboard shows why).
        metrics[CLIENT_BEHIND] = 1.0
        trial_score = Score(trial_score.value, {**trial_score.constraints, CLIENT_BEHIND: 1.0})
        reason = behind if reason is None else f"{behind}; {reason}"
    log_tail = ""
    if crashed:
        reason = "vLLM exited during the window; " + (reason or "")
        log_tail = tail(log_path)
    errors = [r.error for r in result.results if r.error]
    if errors:
        reason = f"{reason or 'some requests failed'}; first error: {errors[0]}"
    return TrialOutcome(engine_args, trial_score, metrics, {}, reason, log_tail)
