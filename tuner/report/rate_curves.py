"""A capacity study's latency against offered rate: which rates of which trials are drawn, how.

Pure, like ``tuner.report.data``: reads the rates each trial measured (``TrialRecord.points``, in
the order measured) and builds one curve per configuration, its points in rate order:

- a point ``passed`` (every SLO met, no request failed), ``missed`` an SLO over its whole window,
  or was ``stopped`` early once its SLOs were lost for certain (its figures are what it had
  reached: lower bounds, like a pruned trial's);
- a curve's capacity is its highest passed rate (the trial's value), marked on the curve;
- at most ``MOST_CURVES`` configurations are drawn, those of the highest capacity, and the
  baseline beside them; the others are named as left out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from tuner.report.data import SLO_ORDER, Parameter, StudyReport, TrialRow, value_of
from tuner.study.capacity.rates import COMPLETED
from tuner.study.measure.judge import GOODPUT_SHARE, SHARE_MET

PASSED, MISSED, STOPPED = "passed", "missed", "stopped"
# The kinds of point, in drawing order.
MARKS = (PASSED, MISSED, STOPPED)
MOST_CURVES = 8
# A legend label is cut past this many characters.
LABEL_CHARS = 64
# Always drawn first: where a server that has run out of room shows first.
FIRST_METRIC = "ttft_p95_s"


@dataclass(frozen=True)
class MeasuredRate:
    """One rate a trial replayed: the offered rate, how it ended and what it measured."""

    rate_req_per_s: float
    mark: str  # PASSED, MISSED or STOPPED
    figures: Mapping[str, float]
    reason: str = ""

    def figure(self, metric: str) -> float | None:
        value = self.figures.get(metric)
        return float(value) if isinstance(value, int | float) else None


@dataclass(frozen=True)
class Curve:
    """One configuration (trial): its rates in rate order, and its capacity (0: none passed)."""

    trial: int
    label: str
    baseline: bool
    capacity_req_per_s: float
    points: tuple[MeasuredRate, ...]

    def line(self, metric: str) -> tuple[tuple[float, float], ...]:
        """``(rate, figure)`` of every point that measured ``metric``, in rate order."""
        return tuple(
            (p.rate_req_per_s, y) for p in self.points if (y := p.figure(metric)) is not None
        )

    def series(self, metric: str) -> dict[str, tuple[tuple[float, float], ...]]:
        """The line's points by how they ended, in ``MARKS`` order."""
        split: dict[str, list[tuple[float, float]]] = {mark: [] for mark in MARKS}
        for p in self.points:
            y = p.figure(metric)
            if y is not None:
                split[p.mark].append((p.rate_req_per_s, y))
        return {mark: tuple(points) for mark, points in split.items()}

    def capacity_mark(self, metric: str) -> tuple[float, float] | None:
        """``(capacity, figure there)``: the highest passed rate; None if none passed."""
        passed = [p for p in self.points if p.mark == PASSED]
        if not passed:
            return None
        top = max(passed, key=lambda p: p.rate_req_per_s)
        y = top.figure(metric)
        return None if y is None else (top.rate_req_per_s, y)


@dataclass(frozen=True)
class CurveSet:
    """The curves drawn (highest capacity first), the trials left out, the metrics drawn."""

    curves: tuple[Curve, ...]
    left_out: tuple[int, ...]
    metrics: tuple[str, ...]


def points_of(points: Sequence[Mapping[str, Any]]) -> tuple[MeasuredRate, ...]:
    """A trial's rates (``TrialRecord.points``), in rate order (rates measured twice in the
    order measured); not a capacity search's saturating window (``COMPLETED``), whose
    latencies are its queue's, far above the rates the search then measures."""
    found = []
    for raw in points:
        if not isinstance(raw, Mapping) or not isinstance(raw.get("rate_req_per_s"), int | float):
            continue
        if COMPLETED in raw:
            continue
        if raw.get("stopped_at_s") is not None:
            mark = STOPPED
        else:
            mark = PASSED if raw.get("passed") else MISSED
        figures = {
            k: float(v)
            for k, v in raw.items()
            if isinstance(v, int | float) and not isinstance(v, bool) and k != "rate_req_per_s"
        }
        reason = str(raw.get("reason") or "")
        found.append(MeasuredRate(float(raw["rate_req_per_s"]), mark, figures, reason))
    return tuple(sorted(found, key=lambda p: p.rate_req_per_s))


def label(row: TrialRow, parameters: Sequence[Parameter]) -> str:
    """``trial 0 (baseline)``, or ``trial 3: max-num-seqs=16, …`` with the searched values
    (the last part of a dotted name; ``default`` where left to vLLM) that fit in
    ``LABEL_CHARS``."""
    if row.kind == "baseline":
        return f"trial {row.number} (baseline)"
    if not parameters:
        return f"trial {row.number}"
    values = []
    for parameter in parameters:
        value = value_of(row, parameter.name)
        name = parameter.name.rsplit(".", 1)[-1]
        values.append(f"{name}={'default' if value is None else value}")
    text = f"trial {row.number}: {', '.join(values)}"
    while len(text) > LABEL_CHARS and len(values) > 1:
        values.pop()  # the values that do not fit go, whole
        text = f"trial {row.number}: {', '.join(values)}, …"
    return text if len(text) <= LABEL_CHARS else text[: LABEL_CHARS - 1] + "…"


def curve_of(row: TrialRow, parameters: Sequence[Parameter]) -> Curve | None:
    """The trial's curve; None if it measured no rate (its engine failed, or it was stopped)."""
    points = points_of(row.points)
    if not points:
        return None
    capacity = max((p.rate_req_per_s for p in points if p.mark == PASSED), default=0.0)
    return Curve(row.number, label(row, parameters), row.kind == "baseline", capacity, points)


def rate_metrics(slos: Mapping[str, float]) -> tuple[str, ...]:
    """The panels: TTFT p95, then each other latency SLO the study has (TPOT p95, end-to-end
    p99); end-to-end p99 where it has neither."""
    others = tuple(m for m in SLO_ORDER if m != FIRST_METRIC and m in slos)
    return (FIRST_METRIC, *(others or ("e2e_p99_s",)))


def curves(
    rows: Sequence[TrialRow],
    parameters: Sequence[Parameter],
    slos: Mapping[str, float],
    most: int = MOST_CURVES,
) -> CurveSet:
    """The ``most`` curves of the highest capacity (the lower trial number first among equals),
    and the baseline's wherever it ranks; the trials with a curve not drawn, by number."""
    every = [c for row in rows if (c := curve_of(row, parameters)) is not None]
    ranked = sorted(every, key=lambda c: (-c.capacity_req_per_s, c.trial))
    kept = [c for i, c in enumerate(ranked) if i < most or c.baseline]
    drawn = {c.trial for c in kept}
    left_out = sorted(c.trial for c in ranked if c.trial not in drawn)
    return CurveSet(tuple(kept), tuple(left_out), rate_metrics(slos))


def rate_curves_of(report: StudyReport, panels: Sequence[str] = ()) -> CurveSet:
    """The study's curves (``curves``), the ``panels`` its presenter draws first
    (``Presenter.rate_panels``) before the latencies."""
    drawn = curves(report.rows, report.parameters, report.slos)
    return replace(drawn, metrics=(*panels, *drawn.metrics))


def rate_limits(report: StudyReport) -> dict[str, float]:
    """Each panel's dashed limit: the study's SLOs, and where its rates were held to a share of
    requests within every SLO (``GOODPUT_SHARE``, recorded on its trials), that share."""
    limits = dict(report.slos)
    for row in report.rows:
        share = row.figures.get(GOODPUT_SHARE)
        if isinstance(share, int | float):
            limits[SHARE_MET] = float(share)
    return limits
