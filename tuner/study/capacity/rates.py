"""The capacity search: the highest arrival rate at which one running server meets every SLO.

Pure: ``search_capacity`` is handed ``measure``, which replays the window at a rate and says
whether it passed, and decides which rates to try. The capacity is the highest rate that
passed; 0 if none did down to ``floor_req_per_s``, the floor itself tried (as the ceiling is)
where a halving would skip past it.

Where the search has no capacity measured before to start from (a study's first trial), it is
also handed ``saturate``: one window offered far above the start (``SATURATING`` times it),
whose figures carry the requests a second the engine worked through while more waited, read
from the prompt tokens it prefilled and the output tokens it streamed (``SUSTAINED``). No rate
above that throughput can be carried for long, so it bounds the capacity from above (one
resolution up, for its own error); the search then bisects on a log scale below that bound
over ``BOUND_BISECTIONS`` halvings of the bound's log range, which at a resolution of 10 %
resolves a capacity from 0.56 of the throughput up in 3 windows: 4 with the saturating one. A
capacity below that range is bracketed downward from the lowest rate failed, or, where the
start lies within as wide a range below that rate, from the start.

From a capacity already measured (a re-measurement's own, a neighbour's, or the gate: one
resolution step above the best capacity so far), the search brackets from there, growing or
shrinking the rate geometrically until one rate passes and one fails, then bisects
(geometrically) until the two are within the requested relative resolution. The first step
is small (``hinted_step``: two resolutions) and each further step squares the last, up to a
doubling: a capacity within 21 % of the start is resolved in 3 windows at a resolution of
10 %; one further off costs at most 2 windows more than doubling from the same start would.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

logger = logging.getLogger(__name__)

# How much the bracket grows or shrinks the rate per window, at most.
GROWTH = 2.0
# How far above the start a saturating window offers the window's requests.
SATURATING = 32.0
# The figures of a saturating window's point: the requests the engine completed in the window's
# second half; those it served then (streaming, or given their first token); and the requests
# a second its work then amounts to at most (where enough were served to say:
# ``tuner.study.capacity.probes.sustained``).
COMPLETED = "saturated_completed"
SERVED = "saturated_served"
SUSTAINED = "sustained_req_per_s"
# The halvings (on a log scale) of the range below a saturating bound that the search plans:
# the range spans ``(1 + resolution) ** (2 ** BOUND_BISECTIONS)``.
BOUND_BISECTIONS = 3
# Two rates whose ratio is within this much of the resolution are within it (rounding).
_ROUNDING = 1e-9


def hinted_step(resolution: float) -> float:
    """The bracket's first step from a measured capacity: two resolutions, so that a pass there
    and a fail one step away leave one bisection (at most a doubling)."""
    return min((1.0 + resolution) ** 2, GROWTH)


@dataclass(frozen=True)
class RatePoint:
    """One rate measured on the running server: passed (every SLO met, no request failed) or
    not, what it measured, and why it failed."""

    rate_req_per_s: float
    passed: bool
    figures: Mapping[str, Any] = field(default_factory=dict)
    reason: str | None = None
    # Set where tuner's client fell behind in the window and could explain its result
    # (tuner.load.health.client_to_blame): a failure then says nothing of the server.
    client_behind: str | None = None

    def as_attr(self) -> dict[str, Any]:
        """The point as a JSON-able mapping, for the trial's user attributes."""
        point: dict[str, Any] = {"rate_req_per_s": self.rate_req_per_s, "passed": self.passed}
        point |= {k: v for k, v in self.figures.items() if isinstance(v, int | float)}
        if self.reason:
            point["reason"] = self.reason
        if self.client_behind:
            point["client_behind"] = self.client_behind
        return point


@dataclass(frozen=True)
class CapacityFound:
    """What the search found: the capacity (0 if no rate passed), every point in the order it
    was measured, and whether the search ended with a bracket within the resolution."""

    capacity_req_per_s: float
    points: tuple[RatePoint, ...]
    resolved: bool
    why_stopped: str
    # Set where the search stopped at its gate (``search_capacity``'s ``gate_req_per_s``): the
    # capacity is below that rate, not measured further.
    below_req_per_s: float | None = None
    # Set where the search ended because tuner's client fell behind in a failing window: that
    # rate's failure says nothing of the server.
    client_behind_at: float | None = None
    # One window more after the search, at another configuration's capacity (the defaults'
    # re-measurement at the leading configuration's: ``CapacitySettings.compare_req_per_s``);
    # not one of the search's points.
    compared: RatePoint | None = None

    @property
    def best_point(self) -> RatePoint | None:
        """The point at the capacity, or None if no rate passed."""
        passed = [p for p in self.points if p.passed]
        return max(passed, key=lambda p: p.rate_req_per_s, default=None)

    @property
    def lowest_point(self) -> RatePoint | None:
        return min(self.points, key=lambda p: p.rate_req_per_s, default=None)


RateMeasure = Callable[[float], RatePoint]


def _span(resolution: float) -> float:
    """The ratio of the range the search bisects below a saturating bound."""
    return (1.0 + resolution) ** (2**BOUND_BISECTIONS)


class _ClientBehind(Exception):
    def __init__(self, rate_req_per_s: float) -> None:
        super().__init__(rate_req_per_s)
        self.rate_req_per_s = rate_req_per_s


def search_capacity(
    measure: RateMeasure,
    start_req_per_s: float,
    resolution: float = 0.1,
    max_probes: int = 10,
    floor_req_per_s: float = 0.0,
    ceiling_req_per_s: float = math.inf,
    first_step: float = GROWTH,
    gate_req_per_s: float | None = None,
    saturate: RateMeasure | None = None,
) -> CapacityFound:
    """The highest rate that passes, to ``resolution`` (0.1: the passing and the failing rate
    within 10 % of each other); at most ``max_probes`` windows, a saturating one included.

    With ``saturate`` (and no gate), the first window offers ``SATURATING`` times
    ``start_req_per_s`` (at most the ceiling) through it, and the search bisects below the
    throughput it read (``_Search.saturated``).

    With ``gate_req_per_s`` (what a searched configuration must carry to matter: a step above
    the best capacity so far), the first window is at that rate instead, and a failure there
    ends the search (``below_req_per_s``): one window says it cannot beat the best. A pass
    brackets upward from the gate in small steps (``hinted_step``).

    Otherwise the bracket starts at ``start_req_per_s`` with a first step of ``first_step`` (a
    factor above 1); each further step squares the last one, up to ``GROWTH``.

    Below ``floor_req_per_s`` (a window too sparse to judge) the search stops with capacity 0,
    once the floor itself has failed: a step that would jump from above the floor to below it
    measures the floor instead. Above ``ceiling_req_per_s`` (what the client can send) it stops
    with the ceiling passed, unresolved.
    """
    if gate_req_per_s is not None and gate_req_per_s <= 0:
        raise ValueError("search_capacity's gate must be a positive rate")
    if start_req_per_s <= 0 or resolution <= 0 or max_probes < 1 or first_step <= 1:
        raise ValueError(
            "search_capacity needs a positive start rate and resolution, 1+ windows and a "
            "first step above 1"
        )
    search = _Search(measure, max_probes)
    try:
        if gate_req_per_s is not None:
            return _gated(search, gate_req_per_s, resolution, floor_req_per_s, ceiling_req_per_s)
        begun = _begun(
            search, start_req_per_s, resolution, first_step, floor_req_per_s,
            ceiling_req_per_s, saturate,
        )  # fmt: skip
        if isinstance(begun, CapacityFound):
            return begun
        lo, hi, step, cap = begun
        found = search.bracket(lo, hi, step, floor_req_per_s, ceiling_req_per_s, cap)
        if isinstance(found, CapacityFound):
            return found
        return search.bisect(*found, resolution)
    except _ClientBehind as behind:
        found = search.found(
            False,
            f"tuner's client fell behind at {behind.rate_req_per_s:.3g} req/s, which failed: the "
            "capacity is at least the highest rate passed (more client processes: --client-procs)",
        )
        return replace(found, client_behind_at=behind.rate_req_per_s)


def _begun(
    search: _Search,
    start: float,
    resolution: float,
    first_step: float,
    floor: float,
    ceiling: float,
    saturate: RateMeasure | None,
) -> tuple[float, float, float, float] | CapacityFound:
    """The search's first windows, a saturating one and the bisection below its bound where
    ``saturate`` is given, else the start: where the bracket goes on from (a passing rate or 0,
    a failing rate or inf, the bracket's first step, and the rate its growth stops below), or
    the search's end."""
    saturated: tuple[float, float, float] | CapacityFound | None = None
    if saturate is not None:
        offered = min(start * SATURATING, ceiling)
        saturated = search.saturated(saturate, offered, resolution, floor)
    if isinstance(saturated, CapacityFound):
        return saturated
    if saturated is not None:
        lo, hi, step = saturated
        if not (lo == 0.0 and _span(resolution) * start >= hi > start):
            return lo, hi, step, math.inf
        # Every rate tried below the bound failed, and the start lies within as wide a range
        # below the lowest of them: on from the start as without a saturating window, below
        # that rate. From further below, halving from that rate is nearer.
        cap = hi
    else:
        cap = math.inf
    rate = min(start, ceiling)
    lo, hi = (rate, math.inf) if search.at(rate).passed else (0.0, rate)
    return lo, hi, first_step, cap


def _gated(
    search: _Search, gate: float, resolution: float, floor: float, ceiling: float
) -> CapacityFound:
    """The gate measured first: a failure there ends the search; a pass brackets upward in
    small steps, then bisects."""
    rate = min(gate, ceiling)
    if not search.at(rate).passed:
        why = (
            f"failed at {rate:.3g} req/s, one resolution step above the best capacity so far: "
            "it cannot beat that by what the search resolves"
        )
        return CapacityFound(0.0, tuple(search.points), False, why, below_req_per_s=rate)
    found = search.bracket(rate, math.inf, hinted_step(resolution), floor, ceiling)
    if isinstance(found, CapacityFound):
        return found
    return search.bisect(*found, resolution)


class _Search:
    """One capacity search's windows: ``at`` measures a rate, ``bracket`` and ``bisect`` move
    the passing and failing rates, ``found`` says what the windows so far found."""

    def __init__(self, measure: RateMeasure, max_probes: int) -> None:
        self.measure = measure
        self.max_probes = max_probes
        self.points: list[RatePoint] = []

    def at(self, rate: float) -> RatePoint:
        point = self.measure(rate)
        self.points.append(point)
        if not point.passed and point.client_behind:
            raise _ClientBehind(rate)
        logger.info(
            "rate %.3f req/s: %s%s",
            rate,
            "passed" if point.passed else "failed",
            f" ({point.reason})" if point.reason else "",
        )
        return point

    def found(self, resolved: bool, why: str) -> CapacityFound:
        passed = [p.rate_req_per_s for p in self.points if p.passed]
        return CapacityFound(max(passed, default=0.0), tuple(self.points), resolved, why)

    def full(self) -> bool:
        return len(self.points) >= self.max_probes

    def saturated(
        self, saturate: RateMeasure, offered: float, resolution: float, floor: float
    ) -> tuple[float, float, float] | CapacityFound | None:
        """The saturating window at ``offered``, then the bisection below its bound
        (``below``): where the bracket goes on from (a passing rate, a failing one, and the
        bracket's first step; ``lo`` 0 where every rate tried failed), or the search's end.

        The bound is a rate measured only where it is the window's own; where no rate below
        it failed, it is measured next (a throughput read low must not cap the capacity), and
        where it passes the bracket grows from it in small steps.
        ``(offered, inf, GROWTH)`` where the window passed; None where it measured no
        throughput of the server's (none, or its failure may be its client's): the search then
        starts as without it."""
        point = saturate(offered)
        self.points.append(point)
        sustained = point.figures.get(SUSTAINED)
        logger.info(
            "saturating window at %.3f req/s: %s",
            offered,
            f"{sustained:.3f} req/s sustained" if sustained is not None else "no throughput",
        )
        if point.passed:
            return offered, math.inf, GROWTH
        if sustained is None or not sustained > 0 or point.client_behind:
            return None
        bound = min(offered, sustained * (1.0 + resolution))
        below = self.below(bound, resolution, floor)
        if isinstance(below, CapacityFound):
            return below
        lo, hi = below
        # No rate failed below the bound, and the throughput may have been read low (a
        # window's second half still filling the engine): the bound is measured before it is
        # believed, and where it passes the bracket grows from it in small steps.
        unmeasured = hi == bound < offered and not self.full()
        if unmeasured and self.at(bound).passed:
            return bound, math.inf, hinted_step(resolution)
        return lo, hi, GROWTH

    def below(
        self, bound: float, resolution: float, floor: float
    ) -> tuple[float, float] | CapacityFound:
        """Bisect on a log scale between ``bound``, a rate the engine cannot carry, and
        ``bound / (1 + resolution) ** (2 ** BOUND_BISECTIONS)``, no rate passed yet: the
        passing and failing rates found (within the resolution once one passed), or the
        failing rate alone (``lo`` 0) where every rate tried failed; the search's end at its
        window limit. A rate below ``floor`` is left to the bracket, which tries the floor."""
        low = bound / _span(resolution)
        lo, hi = 0.0, bound
        while hi / max(lo, low) > (1.0 + resolution) * (1.0 + _ROUNDING):
            rate = math.sqrt(max(lo, low) * hi)
            if rate < floor:
                break
            if self.full():
                return self.found(
                    False, f"probe limit ({self.max_probes}) reached below the saturating bound"
                )
            if self.at(rate).passed:
                lo = rate
            else:
                hi = rate
        return lo, hi

    def bracket(
        self,
        lo: float,
        hi: float,
        first_step: float,
        floor: float,
        ceiling: float,
        cap: float = math.inf,
    ) -> tuple[float, float] | CapacityFound:
        """Grow from ``lo`` while passing, shrink from ``hi`` while failing, each step the square
        of the last (at most ``GROWTH``): the passing and failing rates, or the search's end.
        Growing stops below ``cap``, a rate already failed."""
        step = min(first_step, GROWTH)
        while math.isinf(hi) or lo == 0.0:
            if math.isinf(hi) and lo * step >= cap:
                return lo, cap
            if self.full():
                return self.found(
                    False, f"probe limit ({self.max_probes}) reached while bracketing"
                )
            if math.isinf(hi):
                rate = lo * step
                if rate > ceiling:
                    if lo >= ceiling:
                        return self.found(False, f"passed at the ceiling {ceiling:g} req/s")
                    rate = ceiling
            else:
                rate = hi / step
                if rate < floor:
                    if hi <= floor:
                        return self.found(False, f"failed down to the floor {floor:g} req/s")
                    rate = floor
            if self.at(rate).passed:
                lo = rate
            else:
                hi = rate
            step = min(step * step, GROWTH)
        return lo, hi

    def bisect(self, lo: float, hi: float, resolution: float) -> CapacityFound:
        """Bisect on a log scale (the resolution is relative) until the passing and failing
        rates are within ``resolution`` of each other."""
        while hi / lo > (1.0 + resolution) * (1.0 + _ROUNDING):
            if self.full():
                return self.found(False, f"probe limit ({self.max_probes}) reached while bisecting")
            rate = math.sqrt(lo * hi)
            if self.at(rate).passed:
                lo = rate
            else:
                hi = rate
        return self.found(
            True, f"bracketed within {resolution:.0%}: {lo:.3g} passed, {hi:.3g} failed"
        )
