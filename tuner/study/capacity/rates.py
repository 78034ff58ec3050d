"""The capacity search: the highest arrival rate at which one running server meets every SLO.

Pure: ``search_capacity`` is handed ``measure``, which replays the window at a rate and says
whether it passed, and decides which rates to try. It brackets from a starting rate (the
trace's own, or a capacity already measured in the study), growing or shrinking it geometrically
until one rate passes and one fails, then bisects (geometrically) until the two are within the
requested relative resolution. The capacity is the highest rate that passed; 0 if none did down
to ``floor_req_per_s``, the floor itself tried (as the ceiling is) where a halving would skip past
it.

The bracket doubles or halves at each window, except from the configuration's own capacity
measured before (a re-measurement): there the first step is small (``hinted_step``: two
resolutions) and each further step squares the last, up to a doubling. At a resolution of 10 %
a capacity within 21 % of that start is then resolved in 3 windows instead of 5; one further
off costs at most 2 windows more than doubling from the same start would.
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
) -> CapacityFound:
    """Bracket from ``start_req_per_s``, then bisect to ``resolution`` (0.1: the passing and the
    failing rate within 10 % of each other); at most ``max_probes`` calls of ``measure``.

    With ``gate_req_per_s`` (the best capacity measured so far), the first window is at that
    rate instead, and a failure there ends the search (``below_req_per_s``): a configuration
    that cannot carry the best capacity so far cannot beat it, and one window says so. A pass
    brackets upward from the gate in small steps (``hinted_step``).

    The bracket's first step is ``first_step`` (a factor above 1); each further step squares the
    last one, up to ``GROWTH``.

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
            start_req_per_s = gate_req_per_s
            first_step = hinted_step(resolution)
        rate = min(start_req_per_s, ceiling_req_per_s)
        first = search.at(rate)
        if gate_req_per_s is not None and not first.passed:
            why = f"failed at {rate:.3g} req/s, the best capacity so far: it cannot beat that"
            return CapacityFound(0.0, tuple(search.points), False, why, below_req_per_s=rate)
        lo, hi = (rate, math.inf) if first.passed else (0.0, rate)
        bracket = search.bracket(lo, hi, first_step, floor_req_per_s, ceiling_req_per_s)
        if isinstance(bracket, CapacityFound):
            return bracket
        return search.bisect(*bracket, resolution)
    except _ClientBehind as behind:
        found = search.found(
            False,
            f"tuner's client fell behind at {behind.rate_req_per_s:.3g} req/s, which failed: the "
            "capacity is at least the highest rate passed (more client processes: --client-procs)",
        )
        return replace(found, client_behind_at=behind.rate_req_per_s)


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

    def bracket(
        self, lo: float, hi: float, first_step: float, floor: float, ceiling: float
    ) -> tuple[float, float] | CapacityFound:
        """Grow from ``lo`` while passing, shrink from ``hi`` while failing, each step the square
        of the last (at most ``GROWTH``): the passing and failing rates, or the search's end."""
        step = min(first_step, GROWTH)
        while math.isinf(hi) or lo == 0.0:
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
        while hi / lo > 1.0 + resolution:
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
