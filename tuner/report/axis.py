"""Where a figure's value axis runs: the range of what is drawn, and where its SLO goes.

Pure: numbers in, limits out; ``tuner.report.plots`` and ``tuner.report.rate_plot`` apply them.
The axis is the data's range. An SLO within ``SLO_REACH`` of the data is inside it, drawn as a
dashed line; one further off (a 2,000 ms TTFT SLO over trials that measured 70 to 80 ms) is
left out of the range and marked at the edge it lies beyond, so that the trials keep the
axis's height instead of sitting on it. An axis whose largest value is more than ``LOG_SPAN``
times its smallest is logarithmic.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

# An SLO at most this many times above the data's highest value, or below its lowest, is
# inside the axis; further off, it is marked at the edge.
SLO_REACH = 2.0
# Beyond this ratio between an axis's largest and smallest value, the axis is logarithmic.
LOG_SPAN = 20.0
# The room left beyond the outermost values, as a share of the range (of its logarithm on a
# log axis); a range of one value gets ``FLAT_MARGIN`` of it on either side.
MARGIN = 0.05
FLAT_MARGIN = 0.1

# Where an SLO is: drawn inside the axis, or off it, beyond its upper or lower edge.
INSIDE, ABOVE, BELOW = "inside", "above", "below"


@dataclass(frozen=True)
class ValueAxis:
    """A value axis: its limits, whether it is logarithmic, and where the SLO is (None: the
    panel has none)."""

    low: float
    high: float
    log: bool
    slo_place: str | None = None  # INSIDE, ABOVE or BELOW


def slo_place(values: Sequence[float], slo: float) -> str:
    """Where ``slo`` goes beside ``values`` (finite, at least one): ``INSIDE`` the axis if it
    is within ``SLO_REACH`` of them; else ``ABOVE`` or ``BELOW`` it."""
    low, high = min(values), max(values)
    if slo > high and (high <= 0 or slo > high * SLO_REACH):
        return ABOVE
    if 0 < slo < low and low > slo * SLO_REACH:
        return BELOW
    return INSIDE


def value_axis(values: Sequence[float], slo: float | None = None) -> ValueAxis | None:
    """The axis for ``values`` (the heights drawn, in the axis's unit) and an SLO in the same
    unit; None where there is neither a finite value nor an SLO."""
    drawn = [v for v in values if math.isfinite(v)]
    place = None
    if slo is not None and math.isfinite(slo):
        place = slo_place(drawn, slo) if drawn else INSIDE
        if place == INSIDE:
            drawn.append(slo)
    if not drawn:
        return None
    low, high = min(drawn), max(drawn)
    log = low > 0 and high / low > LOG_SPAN
    if log:
        lo, hi = _padded(math.log10(low), math.log10(high))
        return ValueAxis(10**lo, 10**hi, True, place)
    lo, hi = _padded(low, high)
    return ValueAxis(lo, hi, False, place)


def _padded(low: float, high: float) -> tuple[float, float]:
    """``low`` and ``high`` with ``MARGIN`` of room beyond them; a single value with
    ``FLAT_MARGIN`` of itself (or 1) on either side."""
    room = MARGIN * (high - low) if high > low else (FLAT_MARGIN * abs(high) or 1.0)
    return low - room, high + room
