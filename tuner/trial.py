"""One trial: one engine configuration, started, measured on the replay window, and stopped.

Whatever the configuration does (vLLM rejects an argument, runs out of memory, crashes, never
becomes healthy, errors on requests) comes back as a ``TrialOutcome``; only a bug in tuner, or
the user's Ctrl-C, escapes as an exception.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuner.engine import Engine, EngineFailed, Launcher, ProcessLauncher, tail
from tuner.metrics import parse_scrape, summarize_client, summarize_gauges, summarize_server
from tuner.replay import ReplaySettings, replay
from tuner.scoring import FAILED, Score, score
from tuner.trace import Request

logger = logging.getLogger(__name__)


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
    env: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class TrialOutcome:
    engine_args: Mapping[str, Any]
    score: Score
    metrics: Mapping[str, float]
    timings: Mapping[str, float]
    reason: str | None = None
    log_tail: str = ""

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


def run_trial(engine_args: Mapping[str, Any], setup: TrialSetup, workdir: Path) -> TrialOutcome:
    """Start vLLM with ``engine_args``, replay the window, stop vLLM, score what was measured."""
    engine = Engine(setup.model, engine_args, workdir, launcher=setup.launcher, env=setup.env)
    timings: dict[str, float] = {}
    began = time.monotonic()
    try:
        engine.start()
        timings["engine_healthy_s"] = engine.wait_healthy(setup.health_timeout_s)
        timings |= {f"startup_{k}": v for k, v in engine.times.startup.items()}
        if setup.warmup_requests:
            started = time.monotonic()
            replay(engine.base_url, setup.warmup_requests, setup.replay)
            timings["warmup_s"] = time.monotonic() - started
        started = time.monotonic()
        result = replay(engine.base_url, setup.requests, setup.replay)
        timings["window_s"] = time.monotonic() - started
        crashed = not engine.alive()
    except EngineFailed as exc:
        engine.stop()
        timings["engine_stop_s"] = engine.times.stop_s or 0.0
        timings["trial_s"] = time.monotonic() - began
        logger.info("trial failed: %s", exc.reason)
        return TrialOutcome(engine_args, FAILED, {}, timings, exc.reason, exc.log_tail)
    finally:
        # Also on Ctrl-C: the engine never outlives its trial.
        engine.stop()
    timings["engine_stop_s"] = engine.times.stop_s or 0.0
    timings["trial_s"] = time.monotonic() - began

    metrics: dict[str, float] = summarize_client(result.results, result.duration_s)
    before, after = parse_scrape(result.metrics_before), parse_scrape(result.metrics_after)
    metrics |= summarize_server(before, after)
    metrics |= summarize_gauges([parse_scrape(text) for text in result.metrics_during])
    objective = setup.objective
    trial_score = score(metrics, objective.slos, objective.weights, objective.max_error_rate)
    reason = _why_infeasible(trial_score, metrics)
    log_tail = ""
    if crashed:
        reason = "vLLM exited during the window; " + (reason or "")
        log_tail = tail(engine.log_path)
    errors = [r.error for r in result.results if r.error]
    if errors:
        reason = f"{reason or 'some requests failed'}; first error: {errors[0]}"
    return TrialOutcome(engine_args, trial_score, metrics, timings, reason, log_tail)
