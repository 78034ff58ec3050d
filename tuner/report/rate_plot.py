"""A capacity study's figure: latency against offered rate, one line per configuration.

Draws the curves ``tuner.report.rate_curves`` chose, one panel per metric (TTFT p95 first), with
the helpers and conventions of ``tuner.report.plots``: a rate that passed is a filled circle,
one that missed an SLO a cross, one stopped early a hollow triangle (its figures are lower
bounds, as a pruned trial's are); the star is the configuration's capacity; an SLO is dashed
where near the curves, named at the axis's edge where far off. The key's words for the star and
the order of the configurations are the study's presenter's (``tuner.report.presenters``):
capacity, or goodput.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tuner.report.plots import (
    SLO_LABEL,
    label_of,
    new_figure,
    plain_log_axis,
    save,
    scale_of,
    set_value_axis,
)
from tuner.report.presenters import RATE_PRESENTER, Presenter
from tuner.report.rate_curves import MISSED, PASSED, STOPPED, Curve, CurveSet

# How each kind of point is drawn, in the curve's colour; and its entry in the key.
MARKERS: dict[str, tuple[dict[str, Any], str]] = {
    PASSED: ({"marker": "o"}, "passed every SLO"),
    MISSED: ({"marker": "x"}, "missed an SLO"),
    STOPPED: ({"marker": "^", "fillstyle": "none"}, "stopped early (at least this)"),
}
BASELINE_COLOUR = "black"
# matplotlib's ten-colour cycle without its grey (C7), which the key and the SLO lines use.
COLOURS = ("C0", "C1", "C2", "C3", "C4", "C5", "C6", "C8", "C9")
# The configurations' legend, below the panels: this many to a row.
LEGEND_COLUMNS = 2
# Beyond this ratio between the largest and smallest rate, the rate axis is logarithmic (the
# search doubles and halves them); the latency axes are ``tuner.report.axis``'s.
RATE_LOG_SPAN = 2.5


def _colours(curves: tuple[Curve, ...]) -> list[str]:
    """A colour per curve, in ``COLOURS`` order; the baseline's black."""
    colours, used = [], 0
    for curve in curves:
        if curve.baseline:
            colours.append(BASELINE_COLOUR)
        else:
            colours.append(COLOURS[used % len(COLOURS)])
            used += 1
    return colours


def _panel(ax: Any, drawn: CurveSet, colours: list[str], metric: str, slo: float | None) -> None:
    scale = scale_of(metric)
    ys: list[float] = []
    for curve, colour in zip(drawn.curves, colours, strict=True):
        line = curve.line(metric)
        ax.plot(
            [x for x, _ in line],
            [y * scale for _, y in line],
            color=colour,
            lw=1.2,
            alpha=0.75,
            label=curve.label,
        )
        for mark, points in curve.series(metric).items():
            style, _ = MARKERS[mark]
            ax.plot(
                [x for x, _ in points],
                [y * scale for _, y in points],
                linestyle="none",
                color=colour,
                markersize=6,
                **style,
            )
        top = curve.capacity_mark(metric)
        if top is not None:
            ax.plot(
                top[0],
                top[1] * scale,
                marker="*",
                markersize=15,
                color=colour,
                markeredgecolor="black",
                linestyle="none",
                zorder=4,
            )
        ys += [y * scale for _, y in line]
    set_value_axis(ax, metric, ys, slo)
    rates = [p.rate_req_per_s for c in drawn.curves for p in c.points]
    if rates and min(rates) > 0 and max(rates) / min(rates) > RATE_LOG_SPAN:
        plain_log_axis(ax.xaxis, ax.set_xscale)
    ax.set_xlabel("offered rate (req/s)")
    ax.set_ylabel(label_of(metric))


def key(shown: Presenter = RATE_PRESENTER) -> tuple[list[Any], list[str]]:
    """The legend of the markers, in grey: what a point, the star (``shown``'s words) and the
    dashed line mean."""
    from matplotlib.lines import Line2D

    handles = [
        Line2D([], [], color="grey", linestyle="none", markersize=6, **style)
        for style, _ in MARKERS.values()
    ]
    labels = [text for _, text in MARKERS.values()]
    handles.append(
        Line2D(
            [],
            [],
            color="grey",
            marker="*",
            markersize=12,
            linestyle="none",
            markeredgecolor="black",
        )
    )
    labels.append(shown.star_key)
    handles.append(Line2D([], [], color="grey", linestyle="--", lw=1))
    labels.append("SLO")
    return handles, labels


def plot_rates(
    drawn: CurveSet, slos: Mapping[str, float], path: Path, shown: Presenter = RATE_PRESENTER
) -> Path | None:
    """Each drawn configuration's latencies against the offered rate, the key above the panels
    and the configurations below them, in the words of the study's presenter ``shown``; None if
    there is none."""
    if not drawn.curves:
        return None
    panels = len(drawn.metrics)
    columns = min(len(drawn.curves), LEGEND_COLUMNS)
    legend_rows = -(-len(drawn.curves) // columns)
    fig, axes = new_figure(1, panels, (max(5.0 * panels, 10.0), 4.0 + 0.22 * legend_rows))
    colours = _colours(drawn.curves)
    for ax, metric in zip(axes[0], drawn.metrics, strict=True):
        _panel(ax, drawn, colours, metric, slos.get(metric))
    key_handles, key_labels = key(shown)
    fig.legend(
        key_handles, key_labels, loc="outside upper center", ncols=len(key_labels), fontsize=8
    )
    # The configurations' lines; the SLO is in the key above.
    named = zip(*axes[0][0].get_legend_handles_labels(), strict=True)
    lines = [(handle, text) for handle, text in named if text != SLO_LABEL]
    title = f"configurations, highest {shown.what} first"
    if drawn.left_out:
        title += f"; {len(drawn.left_out)} more left out, of less {shown.what}"
    fig.legend(
        [handle for handle, _ in lines],
        [text for _, text in lines],
        loc="outside lower center",
        ncols=columns,
        fontsize=8,
        title=title,
        title_fontsize=8,
    )
    return save(fig, path)
