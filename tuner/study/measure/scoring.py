"""Scoring one trial: a weighted sum of tails over their SLOs, and the SLOs as constraints.

Pure. Lower scores are better. A constraint value above 0 means the SLO was missed, by that
fraction of the SLO; the study only picks a winner among trials with every value at or below 0.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from tuner.study.plan.spec import StudySpec

# Score of a trial that measured nothing usable (the engine failed, or every request did). It
# is only a placeholder for Optuna's value: such a trial is also infeasible, and infeasible
# trials never win.
FAILED_SCORE = 1000.0


@dataclass(frozen=True)
class Criteria:
    """What a window is judged by: SLOs in seconds, each SLO's weight in the score (the spec's
    ``weights``), and the share of requests that may fail (none, unless given). Passed whole
    from the spec to every judge (``of``), so that no judge is left with SLOs alone."""

    slos: Mapping[str, float]
    weights: Mapping[str, float]
    max_error_rate: float = 0.0

    @classmethod
    def of(cls, spec: StudySpec) -> Criteria:
        """The spec's SLOs, weights and ``max_error_rate``."""
        return cls(spec.slos, spec.weights, spec.max_error_rate)


@dataclass(frozen=True)
class Score:
    """A trial's judgement: ``value`` is what Optuna optimises (a latency study's weighted tails
    over their SLOs, lower better; a capacity study's req/s, higher better), ``constraints``
    one entry per SLO or check, above 0 where it was missed (an SLO by that fraction of it) and
    at or below 0 where met. Only a feasible score, every constraint met, can win."""

    value: float
    constraints: Mapping[str, float]

    @property
    def feasible(self) -> bool:
        return all(v <= 0 for v in self.constraints.values())

    @property
    def violations(self) -> list[str]:
        return [name for name, v in self.constraints.items() if v > 0]


def score(metrics: Mapping[str, float], criteria: Criteria) -> Score:
    """Score a trial's metrics by ``criteria``. A metric an SLO names but the trial lacks counts
    as a miss."""
    slos, weights = criteria.slos, criteria.weights
    constraints: dict[str, float] = {}
    for metric, limit in slos.items():
        value = metrics.get(metric)
        constraints[f"slo_{metric}"] = 1.0 if value is None else (value - limit) / limit
    error_rate = metrics.get("error_rate", 1.0)
    constraints["error_rate"] = error_rate - criteria.max_error_rate
    parts = [w * metrics[m] / slos[m] for m, w in weights.items() if m in metrics]
    if len(parts) < len(weights):
        return Score(FAILED_SCORE, constraints)
    return Score(sum(parts), constraints)


def worst_slo_ratio(metrics: Mapping[str, float], slos: Mapping[str, float]) -> float:
    """The largest metric-to-SLO ratio among the metrics measured so far (0 if none yet).

    Above 1 an SLO is missed; the intermediate value that pruning watches during a window.
    """
    return max((metrics[m] / limit for m, limit in slos.items() if m in metrics), default=0.0)


# The score of a trial whose engine failed outright.
FAILED = Score(FAILED_SCORE, {"failed": 1.0})


@dataclass(frozen=True)
class Miss:
    """One constraint a trial missed: the metric, what was measured and the limit it was held to.

    ``measured`` is None where the trial has no such figure, ``limit`` where it cannot be told.
    """

    metric: str
    measured: float | None
    limit: float | None


@dataclass(frozen=True)
class Verdict:
    """Whether a trial met every SLO, and each one it missed."""

    meets_slos: bool
    misses: tuple[Miss, ...] = ()


def verdict(constraints: Mapping[str, float], metrics: Mapping[str, float]) -> Verdict:
    """The verdict of a recorded trial, from the constraints it was judged by when measured.

    Each limit is recovered from its constraint (``score`` set ``(value - limit) / limit``, and
    ``error_rate - max_error_rate``), so it is the SLO the trial was held to even if the spec
    has changed since. The SLOs come first, then the error rate, then anything else.
    """
    slos, errors, others = [], [], []
    for name, excess in constraints.items():
        if excess <= 0:
            continue
        if name.startswith("slo_"):
            metric = name.removeprefix("slo_")
            value = metrics.get(metric)
            slos.append(Miss(metric, value, None if value is None else value / (1.0 + excess)))
        elif name == "error_rate":
            rate = metrics.get("error_rate", 1.0)
            errors.append(Miss(name, rate, rate - excess))
        else:
            others.append(Miss(name, None, None))
    misses = (*slos, *errors, *others)
    return Verdict(not misses, misses)
