"""Where the report's value axes run: the data's range, an SLO near it drawn, one far off named
at the edge (``tuner.report.axis``); numbers, not pixels."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuner.report.axis import (
    ABOVE,
    BELOW,
    INSIDE,
    LOG_SPAN,
    SLO_REACH,
    ValueAxis,
    slo_place,
    value_axis,
)
from tuner.report.plots import legend_of, new_figure, save, set_value_axis


def spans(
    axis: ValueAxis | None, limits: tuple[float, float], log: bool, place: str | None
) -> bool:
    """Whether ``axis`` runs over ``limits`` (to pytest's tolerance), on that scale, with its
    SLO placed there."""
    return (
        axis is not None
        and (axis.low, axis.high) == pytest.approx(limits)
        and (axis.log, axis.slo_place) == (log, place)
    )


def test_an_slo_far_above_the_trials_is_left_off_the_axis() -> None:
    # A no-spec study: TTFT p95 70 to 80 ms, under the default spec's 2,000 ms SLO.
    axis = value_axis([70.0, 74.0, 80.0], 2000.0)
    assert axis is not None and axis.slo_place == ABOVE and not axis.log
    assert axis.low == pytest.approx(69.5) and axis.high == pytest.approx(80.5)
    # The trials fill the axis, but for a margin of 5 % of their span either side.
    assert (80.0 - 70.0) / (axis.high - axis.low) == pytest.approx(1 / 1.1)


def test_an_slo_near_the_trials_is_drawn_inside() -> None:
    axis = value_axis([160.0, 230.0, 300.0], 300.0)
    assert spans(axis, (153.0, 307.0), False, INSIDE)
    # Above the data but within reach: the axis runs up to it.
    above = value_axis([2000.0, 4200.0], 7000.0)
    assert above is not None and above.slo_place == INSIDE and above.high > 7000.0
    # Every trial over it, as an infeasible study's are: it runs down to it.
    below = value_axis([3000.0, 3200.0], 2000.0)
    assert below is not None and below.slo_place == INSIDE and below.low < 2000.0


def test_the_reach_is_a_factor_either_way() -> None:
    assert slo_place([50.0, 100.0], 100.0 * SLO_REACH) == INSIDE
    assert slo_place([50.0, 100.0], 100.0 * SLO_REACH * 1.01) == ABOVE
    assert slo_place([50.0, 100.0], 50.0 / SLO_REACH) == INSIDE
    assert slo_place([50.0, 100.0], 50.0 / SLO_REACH / 1.01) == BELOW
    # Trials that measured nothing above zero: any SLO over them is off the axis.
    assert slo_place([0.0, 0.0], 0.2) == ABOVE
    # A zero limit (an error rate) is never below a line of zeros: it is drawn.
    assert slo_place([0.0, 0.1], 0.0) == INSIDE


def test_a_wide_range_is_logarithmic_with_the_slo_inside_it() -> None:
    # The defaults at 70 ms, a pruned trial stopped at 5,000 ms, the SLO 2,000 ms between.
    axis = value_axis([70.0, 75.0, 5000.0], 2000.0)
    assert axis is not None and axis.log and axis.slo_place == INSIDE
    assert axis.low < 70.0 and axis.high > 5000.0
    assert axis.high / axis.low == pytest.approx((5000.0 / 70.0) ** 1.1)
    # A range just within LOG_SPAN stays linear; one beyond it does not.
    assert spans(value_axis([1.0, LOG_SPAN]), (0.05, LOG_SPAN + 0.95), False, None)
    wide = value_axis([1.0, LOG_SPAN * 1.01])
    assert wide is not None and wide.log
    # A zero in the data keeps it linear: a log axis could not place it.
    flat = value_axis([0.0, 1.0, 1000.0])
    assert flat is not None and not flat.log


def test_one_value_or_none() -> None:
    # One trial, or every trial the same: room on either side of it.
    assert spans(value_axis([30.0]), (27.0, 33.0), False, None)
    assert value_axis([0.0]) == ValueAxis(-1.0, 1.0, False, None)
    # No trial measured the figure: the SLO alone, drawn.
    assert spans(value_axis([], 200.0), (180.0, 220.0), False, INSIDE)
    assert value_axis([float("nan")], 200.0) == value_axis([], 200.0)
    assert value_axis([]) is None and value_axis([float("inf")]) is None


def test_a_panel_takes_the_axis_and_names_an_slo_off_it(tmp_path: Path) -> None:
    fig, axes = new_figure(1, 2, (8.0, 3.0))
    far, near = axes[0]
    set_value_axis(far, "ttft_p95_s", [70.0, 80.0], 2.0)  # drawn in ms, the SLO in seconds
    axis = value_axis([70.0, 80.0], 2000.0)
    assert axis is not None and far.get_ylim() == pytest.approx((axis.low, axis.high))
    assert far.get_title(loc="right") == "SLO 2000 ms, above ↑"
    assert far.get_legend_handles_labels()[1] == []  # no line drawn for it
    set_value_axis(near, "ttft_p95_s", [1500.0, 3000.0], 2.0)
    assert near.get_title(loc="right") == "" and near.get_legend_handles_labels()[1] == ["SLO"]
    assert near.get_yscale() == "linear" and near.get_ylim()[0] < 1500.0
    handles, labels = legend_of(axes)
    assert labels == ["SLO"] and len(handles) == 1
    assert save(fig, tmp_path / "panels.png").read_bytes().startswith(b"\x89PNG")
