"""The figures of a study, as PNGs: shared by ``tuner report`` and ``benchmarks/gpu/report.py``.

Each function draws series that ``tuner.report.data`` chose and returns the file written, or
None when there is nothing to draw. matplotlib is imported inside, with the Agg backend.
Feasible trials are green circles, infeasible ones red crosses, pruned ones hollow orange
triangles (their figures are lower bounds: where they were when stopped). A value axis runs
over what is drawn (``tuner.report.axis``): an SLO near it is a dashed line, one far off is
named at the edge it lies beyond.
A capacity study's latency against offered rate is ``tuner.report.rate_plot``'s.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tuner.report.axis import ABOVE, BELOW, INSIDE, value_axis
from tuner.report.data import (
    COST_PARTS,
    FEASIBLE,
    INFEASIBLE,
    PRUNED,
    SERIES,
    VALUED_BY,
    Parameter,
    Point,
    TrialRow,
    cost,
    history,
    in_seconds,
    landscape,
    not_measurement_share,
)
from tuner.report.presenters import presenter_of
from tuner.study.measure.judge import SHARE_MET
from tuner.study.setup.objective import LATENCY_OBJECTIVE, StudyObjective

# The metrics the landscape draws each parameter against, after the study's value.
LANDSCAPE_METRICS = ("ttft_p95_s", "tpot_p95_s")
# The figures drawn per trial.
TRIAL_METRICS = ("ttft_p95_s", "tpot_p95_s", "e2e_p99_s")
STYLE: dict[str, dict[str, Any]] = {
    FEASIBLE: {"color": "tab:green", "marker": "o", "label": "feasible"},
    INFEASIBLE: {"color": "tab:red", "marker": "x", "label": "infeasible (missed an SLO)"},
    PRUNED: {
        "facecolors": "none",
        "edgecolors": "tab:orange",
        "marker": "^",
        "label": "pruned (at least this)",
    },
}
DPI = 100
# An SLO's dashed line in a legend.
SLO_LABEL = "SLO"
LABELS = {
    **{metric: presenter_of(objective).value_label for metric, objective in VALUED_BY.items()},
    SHARE_MET: "requests within every SLO (share)",
    "error_rate": "error rate",
    "throughput_req_per_s": "throughput (req/s)",
    "throughput_output_tokens_per_s": "output tokens (tok/s)",
}


def new_figure(rows: int, cols: int, size: tuple[float, float]) -> tuple[Any, Any]:
    """A matplotlib figure (Agg, no display) and its grid of axes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(rows, cols, figsize=size, squeeze=False, constrained_layout=True)
    return fig, axes


def save(fig: Any, path: Path) -> Path:
    """Write the figure as a PNG at ``path`` and close it."""
    fig.savefig(path, dpi=DPI)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def label_of(metric: str) -> str:
    """``ttft_p95_s`` -> ``TTFT p95 (ms)``: how a person reads a figure's name."""
    if metric in LABELS:
        return LABELS[metric]
    name, _, quantile = metric.removesuffix("_s").partition("_")
    if in_seconds(metric) and name in ("ttft", "tpot", "e2e", "itl"):
        return f"{name.upper()} {quantile} (ms)"
    return metric


def plain_log_axis(axis: Any, set_scale: Any) -> None:
    """A log axis whose ticks read 1, 2, 5, 10, 20 ... rather than powers of ten."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    set_scale("log")
    axis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    axis.set_minor_formatter(NullFormatter())


def set_value_axis(ax: Any, metric: str, drawn: Sequence[float], slo: float | None) -> None:
    """The y axis of a panel of ``metric`` (``drawn``: the heights plotted, in the axis's unit)
    as ``tuner.report.axis`` places it: its SLO a dashed line inside, or named over the panel
    with the edge it lies beyond."""
    scale = scale_of(metric)
    limit = None if slo is None else slo * scale
    axis = value_axis(drawn, limit)
    if axis is None:
        return
    if axis.log:
        plain_log_axis(ax.yaxis, ax.set_yscale)
    ax.set_ylim(axis.low, axis.high)
    if axis.slo_place == INSIDE:
        ax.axhline(limit, color="grey", linestyle="--", lw=1, label=SLO_LABEL)
    elif axis.slo_place in (ABOVE, BELOW):
        # Over the panel's top right corner, clear of the points: "SLO 2000 ms, above ↑".
        unit = " ms" if in_seconds(metric) else ""
        where = "above ↑" if axis.slo_place == ABOVE else "below ↓"
        ax.set_title(f"SLO {limit:g}{unit}, {where}", loc="right", fontsize=8, color="dimgrey")


def legend_of(axes: Any) -> tuple[list[Any], list[str]]:
    """The entries of every panel's legend, each label once, in the order first drawn: a
    panel whose SLO is off its axis draws no SLO line, another may."""
    handles, labels = [], []
    for ax in (ax for row in axes for ax in row):
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            if label not in labels:
                handles.append(handle)
                labels.append(label)
    return handles, labels


def _trial_axis(ax: Any) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.set_xlabel("trial")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def scale_of(metric: str) -> float:
    """What a figure is multiplied by on an axis: seconds are drawn in milliseconds."""
    return 1000.0 if in_seconds(metric) else 1.0


def _positions(points: Sequence[Point], parameter: Parameter) -> dict[Any, float]:
    """Where each value sits on a categorical axis (None, vLLM's default, first)."""
    if parameter.numeric:
        return {}
    values = sorted({p.x for p in points}, key=lambda v: (v is not None, str(v)))
    return {v: float(i) for i, v in enumerate(values)}


def _landscape_panel(
    ax: Any, rows: Sequence[TrialRow], parameter: Parameter, metric: str, slo: float | None
) -> None:
    series = landscape(rows, parameter.name, metric)
    scale = scale_of(metric)
    every = [p for points in series.values() for p in points]
    where = _positions(every, parameter)
    for name in SERIES:
        placed = [p for p in series[name] if where or p.x is not None]
        xs = [where[p.x] if where else p.x for p in placed]
        ax.scatter(xs, [p.y * scale for p in placed], s=36, **STYLE[name])
        for p in series[name]:
            if p.x is None and not where:
                # Left to vLLM's default, whose value the study does not know: a level, not a point.
                ax.axhline(p.y * scale, color="tab:blue", linestyle=":", lw=1)
                ax.annotate(
                    f"trial {p.trial}: vLLM's default",
                    (0.01, p.y * scale),
                    xycoords=("axes fraction", "data"),
                    fontsize=7,
                    color="tab:blue",
                    va="bottom",
                )
    set_value_axis(ax, metric, [p.y * scale for p in every], slo)
    name = parameter.name
    if where:
        ax.set_xticks(list(where.values()))
        ax.set_xticklabels(["default" if v is None else str(v) for v in where])
    elif every and all(p.x is None for p in every):
        # A panel of levels alone (every trial left the argument to vLLM, the others pruned
        # or failed): no value to place, so no scale to show.
        ax.set_xticks([])
        name += " (vLLM's default only)"
    elif parameter.log and any(isinstance(p.x, int | float) and p.x > 0 for p in every):
        plain_log_axis(ax.xaxis, ax.set_xscale)
    ax.set_xlabel(name)
    ax.set_ylabel(label_of(metric))


def plot_landscape(
    rows: Sequence[TrialRow],
    parameters: Sequence[Parameter],
    slos: Mapping[str, float],
    path: Path,
    objective: StudyObjective = LATENCY_OBJECTIVE,
) -> Path | None:
    """Each searched parameter (a row of panels) against the study's value (the score, or the
    capacity), TTFT p95 and TPOT p95."""
    metrics = (objective.metric, *LANDSCAPE_METRICS)
    # A trial in a series with any of the figures: else (every trial failed) nothing to place.
    placed = any(
        r.outcome in SERIES and any(r.figure(m) is not None for m in metrics) for r in rows
    )
    if not parameters or not placed:
        return None
    fig, axes = new_figure(
        len(parameters), len(metrics), (4.2 * len(metrics), 3.2 * len(parameters))
    )
    for i, parameter in enumerate(parameters):
        for j, metric in enumerate(metrics):
            _landscape_panel(axes[i][j], rows, parameter, metric, slos.get(metric))
    handles, labels = legend_of(axes)
    fig.legend(handles, labels, loc="outside upper center", ncols=len(labels), fontsize=8)
    return save(fig, path)


def plot_trials(rows: Sequence[TrialRow], slos: Mapping[str, float], path: Path) -> Path | None:
    """TTFT p95, TPOT p95 and end-to-end p99 of every trial, by trial number."""
    drawn = [r for r in rows if r.outcome in SERIES]
    if not drawn:
        return None
    fig, axes = new_figure(1, len(TRIAL_METRICS), (4.2 * len(TRIAL_METRICS), 3.4))
    for ax, metric in zip(axes[0], TRIAL_METRICS, strict=True):
        scale = scale_of(metric)
        for name in SERIES:
            mine = [r for r in drawn if r.outcome == name and r.figure(metric) is not None]
            ys = [(r.figure(metric) or 0.0) * scale for r in mine]
            ax.scatter([r.number for r in mine], ys, s=36, **STYLE[name])
        for r in drawn:
            y = r.figure(metric)
            if r.kind != "searched" and y is not None:
                text = "defaults" if r.kind == "baseline" else r.kind
                ax.annotate(text, (r.number, y * scale), fontsize=7, xytext=(4, 4),
                            textcoords="offset points")  # fmt: skip
        heights = [y * scale for r in drawn if (y := r.figure(metric)) is not None]
        set_value_axis(ax, metric, heights, slos.get(metric))
        _trial_axis(ax)
        ax.set_ylabel(label_of(metric))
    handles, labels = legend_of(axes)
    fig.legend(handles, labels, loc="outside upper center", ncols=len(labels), fontsize=8)
    return save(fig, path)


def plot_history(
    rows: Sequence[TrialRow], path: Path, objective: StudyObjective = LATENCY_OBJECTIVE
) -> Path | None:
    """Every served trial's value, and the best feasible value found so far (the lowest
    score, or the highest capacity)."""
    steps = history(rows, objective)
    if not any(s.value is not None for s in steps):
        return None
    fig, axes = new_figure(1, 1, (8.0, 3.4))
    ax = axes[0][0]
    for name in (FEASIBLE, INFEASIBLE):
        mine = [s for s in steps if s.outcome == name and s.value is not None]
        ax.scatter([s.trial for s in mine], [s.value for s in mine], s=36, **STYLE[name])
    best = [s for s in steps if s.best_so_far is not None]
    if best:
        ax.step([s.trial for s in best], [s.best_so_far for s in best], where="post",
                color="tab:blue", label="best feasible so far")  # fmt: skip
    _trial_axis(ax)
    ax.set_ylabel(label_of(objective.metric))
    fig.legend(loc="outside right upper", fontsize=8)
    return save(fig, path)


def plot_cost(rows: Sequence[TrialRow], path: Path) -> Path | None:
    """Where each trial's time went: engine start, warm-up, window, engine stop, the rest."""
    bars = cost(rows)
    if not bars:
        return None
    fig, axes = new_figure(1, 1, (8.0, 3.6))
    ax = axes[0][0]
    numbers = [b.trial for b in bars]
    bottom = [0.0] * len(bars)
    labels = [label for _, label in COST_PARTS]
    for i, label in enumerate([*labels, "other (set-up, metrics)"]):
        values = [b.parts_s[i] if i < len(labels) else b.other_s for b in bars]
        ax.bar(numbers, values, bottom=bottom, label=label)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    share = not_measurement_share(bars)
    ax.set_title(f"not measurement: {share:.0%} of the trials' time" if share is not None else "")
    _trial_axis(ax)
    ax.set_ylabel("seconds")
    fig.legend(loc="outside right upper", fontsize=8)
    return save(fig, path)
