"""The figures of a study, as PNGs: shared by ``tuner report`` and ``benchmarks/gpu/report.py``.

Each function draws series that ``tuner.report.data`` chose and returns the file written, or
None when there is nothing to draw. matplotlib is imported inside, with the Agg backend.
Feasible trials are green circles, infeasible ones red crosses, pruned ones hollow orange
triangles (their figures are lower bounds: where they were when stopped); SLOs are dashed.
A capacity study's latency against offered rate is ``tuner.report.rate_plot``'s.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

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
from tuner.study.measure.objective import LATENCY_OBJECTIVE, StudyObjective

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
LABELS = {
    **{metric: objective.value_label for metric, objective in VALUED_BY.items()},
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
    if slo is not None:
        ax.axhline(slo * scale, color="grey", linestyle="--", lw=1, label="SLO")
    if where:
        ax.set_xticks(list(where.values()))
        ax.set_xticklabels(["default" if v is None else str(v) for v in where])
    elif parameter.log and any(isinstance(p.x, int | float) and p.x > 0 for p in every):
        # Only where a point has a value: a panel of levels alone (every trial left the
        # argument to vLLM, the others pruned) has no data a log axis could take.
        plain_log_axis(ax.xaxis, ax.set_xscale)
    ys = [p.y * scale for p in every]
    if ys and min(ys) > 0 and max(ys) / min(ys) > 20:
        plain_log_axis(ax.yaxis, ax.set_yscale)
    ax.set_xlabel(parameter.name)
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
    if not parameters:
        return None
    metrics = (objective.metric, *LANDSCAPE_METRICS)
    fig, axes = new_figure(
        len(parameters), len(metrics), (4.2 * len(metrics), 3.2 * len(parameters))
    )
    for i, parameter in enumerate(parameters):
        for j, metric in enumerate(metrics):
            _landscape_panel(axes[i][j], rows, parameter, metric, slos.get(metric))
    handles, labels = axes[0][-1].get_legend_handles_labels()
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
        if metric in slos:
            ax.axhline(slos[metric] * scale, color="grey", linestyle="--", lw=1, label="SLO")
        _trial_axis(ax)
        ax.set_ylabel(label_of(metric))
    handles, labels = axes[0][0].get_legend_handles_labels()
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
