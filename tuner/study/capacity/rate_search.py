"""A capacity trial's measure: ``RateSearch``, the highest rate the running server carries within
the SLOs (``tuner.study.capacity.probes.measure_capacity``), started where the study already
measured the same configuration, or the nearest one (``start_hint``).
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from optuna.distributions import BaseDistribution, FloatDistribution, IntDistribution
from optuna.trial import FrozenTrial, TrialState

from tuner.engine.handle import EngineFailed
from tuner.load.health import CLIENT_BEHIND
from tuner.load.metrics import LiveRequest, so_far
from tuner.study.capacity.probes import (
    CAPACITY_FAILED,
    CapacitySettings,
    StartHint,
    capacity_score,
    measure_capacity,
)
from tuner.study.capacity.rates import SATURATING, CapacityFound
from tuner.study.measure.scoring import Score
from tuner.study.measure.trial import (
    RATE,
    Ended,
    Measure,
    ShouldStop,
    TrialOutcome,
    TrialProgress,
    TrialSetup,
)
from tuner.study.store.record import (
    BELOW_ATTR,
    CAPACITY_ATTR,
    RATES_ATTR,
    RESOLVED_ATTR,
    START_ATTR,
    TrialRecord,
)


class RateSearch(Measure):
    """A capacity trial's measure: the highest rate the running server carries within the SLOs
    (``tuner.study.capacity.probes.measure_capacity``), from where ``settings`` says."""

    def __init__(self, settings: CapacitySettings) -> None:
        self.settings = settings

    @property
    def env(self) -> Mapping[str, str]:
        # vLLM serves /reset_prefix_cache, which the search calls between rates where it has
        # no blocks to prime, only in its development mode.
        return {"VLLM_SERVER_DEV_MODE": "1"}

    def describe(self) -> str:
        settings = self.settings
        judged = ""
        if settings.goodput_share is not None:
            judged = (
                f"; a rate passes where at least {settings.goodput_share:.0%} of its requests "
                "meet every SLO"
            )
        start = f"from {settings.window_req_per_s:.3g} req/s (the window's rate; "
        if settings.saturate:
            offered = SATURATING * settings.window_req_per_s
            start = (
                f"below the throughput one window at {offered:.3g} req/s reads (a study's first "
                "trial; "
            )
        return (
            f"capacity search: {start}a later trial from the capacity of the same or the "
            f"nearest configuration), {settings.probe_s:g} s a rate (longer where that holds "
            f"fewer than {settings.min_requests} requests, after a lead-in of about a "
            f"request's end-to-end time), to within {settings.resolution:.0%}, at most "
            f"{settings.max_probes} rates a trial" + judged
        )

    def for_trial(
        self,
        trials: Callable[[], Sequence[FrozenTrial]],
        args: Mapping[str, Any],
        params: Mapping[str, Any],
        gate: Callable[[], float | None],
        compare: Callable[[], float | None] = lambda: None,
    ) -> RateSearch:
        """Start where this configuration, or its nearest neighbour, already measured its
        capacity (fewer windows than from the trace's rate), gated one resolution step above
        ``gate()`` (the best capacity so far: a configuration that cannot carry more than that
        cannot beat it by what the search resolves, and one window says so); measure one
        window more at ``compare()`` where it is above the capacity found."""
        hint = start_hint(trials(), args, params)
        best = gate()
        bar = None if best is None else best * (1.0 + self.settings.resolution)
        settings = replace(self.settings, hint=hint, gate_req_per_s=bar)
        return RateSearch(replace(settings, compare_req_per_s=compare()))

    def run(
        self, base_url: str, setup: TrialSetup, should_stop: ShouldStop | None
    ) -> CapacityFound:
        """The search on the running server, telling progress as each rate replays."""
        settings, progress = self.settings, setup.progress

        def on_rate(index: int, rate: float, elapsed_s: float, live: Sequence[LiveRequest]) -> None:
            if progress is not None:
                done, ttft_p95_s = so_far(live)
                phase = f"{RATE} {index + 1}/{settings.max_probes}: {rate:.3g} req/s"
                progress(TrialProgress(phase, elapsed_s, settings.probe_s, done, None, ttft_p95_s))

        return measure_capacity(base_url, settings, setup.replay, setup.criteria, on_rate)

    def outcome(
        self, engine_args: Mapping[str, Any], setup: TrialSetup, measured: Any, ended: Ended
    ) -> TrialOutcome:
        """Its value the capacity; its figures those at the capacity (or at the lowest rate
        tried, if none passed); every rate measured as a point."""
        found: CapacityFound = measured
        shown = found.best_point or found.lowest_point
        metrics = dict(shown.figures) if shown is not None else {}
        metrics[CAPACITY_ATTR] = found.capacity_req_per_s
        metrics[RESOLVED_ATTR] = float(found.resolved)
        metrics[RATES_ATTR] = float(len(found.points))
        if found.points:  # the gate, a hint (``start_hint``) or the window's rate
            metrics[START_ATTR] = self.settings.start_req_per_s
        passed = found.capacity_req_per_s > 0
        reason = None if passed else f"no rate met the SLOs: {found.why_stopped}"
        score = capacity_score(found.capacity_req_per_s)
        if found.client_behind_at is not None and not passed:
            # No rate passed, and the one that failed did so with tuner's client behind: not the
            # configuration's figure (a re-measurement so flagged is left out of its median).
            metrics[CLIENT_BEHIND] = 1.0
            score = Score(score.value, {**score.constraints, CLIENT_BEHIND: 1.0})
        gated = found.below_req_per_s is not None and not ended.crashed
        if gated and found.below_req_per_s is not None:
            # Stopped at its gate: below the best so far, by how much not measured.
            del metrics[CAPACITY_ATTR]
            metrics[BELOW_ATTR] = found.below_req_per_s
            reason = found.why_stopped
        log_tail = ""
        if ended.crashed:
            reason = "vLLM exited during the search; " + (reason or "")
            log_tail = ended.log_tail
        return TrialOutcome(
            engine_args,
            score,
            metrics,
            ended.timings,
            reason,
            log_tail,
            compile_cache=ended.compiled,
            points=tuple(p.as_attr() for p in found.points),
            pruned=gated,
            compared=None if found.compared is None else found.compared.as_attr(),
        )

    def failed(self, engine_args: Mapping[str, Any], exc: EngineFailed) -> TrialOutcome:
        """Infeasible, with a capacity of 0."""
        return TrialOutcome(
            engine_args,
            CAPACITY_FAILED,
            {CAPACITY_ATTR: 0.0, **self.settings.marks},
            {},
            exc.reason,
            exc.log_tail,
        )


def start_hint(
    trials: Sequence[FrozenTrial], args: Mapping[str, Any], params: Mapping[str, Any]
) -> StartHint | None:
    """Where the capacity search of a trial with engine arguments ``args`` (its searched values
    ``params``) starts: the median capacity of earlier measurements of the same arguments (a
    re-measurement); else the median capacity of the measured trials nearest in the searched
    space, each dimension scaled to its range (log where the dimension is); None where no trial
    with the same dimensions measured a capacity above 0."""
    measured = [
        (t, recorded)
        for t in trials
        if t.state == TrialState.COMPLETE
        and ((recorded := TrialRecord.of(t)).capacity_req_per_s or 0) > 0
    ]
    wanted = json.loads(json.dumps(dict(args)))
    same = [r for _, r in measured if r.engine_args == wanted]
    if same:
        return _hint(same, repeat=True)
    near = [
        (_distance(params, t.params, t.distributions), r)
        for t, r in measured
        if params and set(t.params) == set(params)
    ]
    if not near:
        return None
    closest = min(d for d, _ in near)
    return _hint([r for d, r in near if d == closest], repeat=False)


def _hint(records: Sequence[TrialRecord], repeat: bool) -> StartHint:
    """The median capacity of ``records``, with the median end-to-end time measured at it."""
    capacity = float(statistics.median(r.capacity_req_per_s or 0.0 for r in records))
    e2es = [e2e for r in records if (e2e := _e2e_at_capacity(r)) is not None]
    return StartHint(capacity, repeat, float(statistics.median(e2es)) if e2es else None)


def _e2e_at_capacity(record: TrialRecord) -> float | None:
    """The median end-to-end time of the highest rate a trial passed, where it recorded one."""
    passed = [p for p in record.points if p.get("passed")]
    best = max(passed, key=lambda p: float(p.get("rate_req_per_s", 0.0)), default=None)
    e2e = None if best is None else best.get("e2e_p50_s")
    return float(e2e) if isinstance(e2e, int | float) else None


def _distance(
    a: Mapping[str, Any], b: Mapping[str, Any], distributions: Mapping[str, BaseDistribution]
) -> float:
    """Euclidean distance of two points of the searched space, each dimension scaled to 0..1."""
    total = 0.0
    for name, value in a.items():
        dist = distributions[name]
        if not isinstance(dist, IntDistribution | FloatDistribution):
            total += 0.0 if value == b[name] else 1.0
            continue
        scale = math.log if dist.log else float
        low, high, x, y = (scale(v) for v in (dist.low, dist.high, value, b[name]))
        if high > low:
            total += ((x - y) / (high - low)) ** 2
    return math.sqrt(total)
