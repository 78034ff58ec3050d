"""A study's trials as plain rows, and the series the figures draw from them.

Pure: reads finished trials (Optuna's ``FrozenTrial``, through its public attributes only) and
builds frozen values; no I/O. Which trial goes into which series is decided here, not in the
plotting code, so that it can be tested without drawing anything:

- a trial is ``feasible`` or ``infeasible`` (it served its whole window: it has a value and
  figures, and met every SLO or missed one), ``pruned`` (stopped early: its figures are what it
  had reached, lower bounds, and it has no value), ``failed`` (its engine failed or it measured
  nothing usable), ``interrupted`` (Ctrl-C) or ``running``;
- a trial's value is what the study ranks it by (its objective's ``metric``, ranked as the
  objective says): the score, lowest best, or in a capacity study the capacity, highest best;
- the landscape and the per-trial figures show feasible, infeasible and pruned trials; the
  value only the first two; failed, interrupted and running trials only the table.

A capacity study's rates, per configuration, are ``tuner.report.rate_curves``'s.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuner.study.measure.trial import ENGINE_START_S, ENGINE_STOP_S, TRIAL_S, WARMUP_S, WINDOW_S
from tuner.study.setup.objective import (
    CAPACITY_OBJECTIVE,
    LATENCY_OBJECTIVE,
    OBJECTIVES,
    StudyObjective,
)
from tuner.study.store.record import DEVICE, VLLM_DEFAULTS, VLLM_VERSION, TrialRecord
from tuner.study.trials import picks
from tuner.study.trials.fingerprint import WORKLOAD_ATTR

if TYPE_CHECKING:
    from optuna.trial import FrozenTrial

FEASIBLE, INFEASIBLE, PRUNED = "feasible", "infeasible", "pruned"
FAILED, INTERRUPTED, RUNNING = "failed", "interrupted", "running"
# The series of the landscape and of the per-trial figures, in drawing order.
SERIES = (FEASIBLE, INFEASIBLE, PRUNED)
SCORE = LATENCY_OBJECTIVE.metric
CAPACITY = CAPACITY_OBJECTIVE.metric
# The objective whose value goes by each name: a latency study's score, a capacity study's
# capacity.
VALUED_BY = {objective.metric: objective for objective in OBJECTIVES.values()}
VALUES = tuple(VALUED_BY)
# How SLOs are listed: the usual ones first, the error rate last.
SLO_ORDER = ("ttft_p95_s", "tpot_p95_s", "e2e_p99_s")

# Where a trial's time went, in order: its phase (``TrialRecord.timings_s``), label; the
# rest of its ``TRIAL_S`` is set-up and scraping.
COST_PARTS = (
    (ENGINE_START_S, "engine start"),
    (WARMUP_S, "warm-up"),
    (WINDOW_S, "window"),
    (ENGINE_STOP_S, "engine stop"),
)


def in_seconds(metric: str) -> bool:
    """``ttft_p95_s`` is in seconds; ``capacity_req_per_s`` is a rate."""
    return metric.endswith("_s") and not metric.endswith("_per_s")


@dataclass(frozen=True)
class TrialRow:
    """One trial as the report shows it: its record's fields (``TrialRecord``) that the page
    and the figures read."""

    number: int
    outcome: str
    kind: str  # "baseline", "candidate N" or "searched"
    engine_args: Mapping[str, Any]
    value: float | None  # the study's value (score or capacity): served trials only
    figures: Mapping[str, Any] = field(repr=False)  # ``TrialRecord.figures``
    constraints: Mapping[str, float] = field(repr=False)
    reason: str = ""
    timings_s: Mapping[str, float] = field(default_factory=dict, repr=False)
    points: tuple[Mapping[str, Any], ...] = field(default=(), repr=False)

    def figure(self, metric: str) -> float | None:
        """The trial's ``metric`` (its value for ``SCORE`` or ``CAPACITY``), or None if it has
        none."""
        value = self.value if metric in VALUES else self.figures.get(metric)
        return float(value) if isinstance(value, int | float) else None

    def seconds(self, phase: str) -> float | None:
        """The seconds of the trial's ``phase`` (``COST_PARTS``, ``TRIAL_S``), if recorded."""
        return self.timings_s.get(phase)


@dataclass(frozen=True)
class Parameter:
    """A searched engine argument: its name, and whether its values are numbers on a log axis."""

    name: str
    numeric: bool
    log: bool


@dataclass(frozen=True)
class Point:
    """One trial in a landscape: the parameter's value (None: left to vLLM) and the figure."""

    trial: int
    x: Any
    y: float


@dataclass(frozen=True)
class HistoryStep:
    """One trial in the order run: its value, how it ended and the best feasible value so far."""

    trial: int
    value: float | None
    outcome: str
    best_so_far: float | None  # best feasible value among trials up to this one


@dataclass(frozen=True)
class CostBar:
    """Where one trial's seconds went; ``other_s`` is the rest of the trial (set-up, scraping)."""

    trial: int
    parts_s: tuple[float, ...]  # in the order of COST_PARTS
    other_s: float

    @property
    def total_s(self) -> float:
        return sum(self.parts_s) + self.other_s

    @property
    def window_s(self) -> float:
        return self.parts_s[2]


def _kind(recorded: TrialRecord) -> str:
    if recorded.baseline:
        return "baseline"
    if recorded.candidate is not None:
        return f"candidate {recorded.candidate}"
    return "searched"


def _outcome(trial: FrozenTrial, recorded: TrialRecord) -> str:
    state = trial.state.name
    if state == "PRUNED":
        return PRUNED
    if state == "FAIL":
        return INTERRUPTED
    if state != "COMPLETE":
        return RUNNING
    if not picks.served(trial):
        return FAILED
    return FEASIBLE if recorded.feasible else INFEASIBLE


def row_of(trial: FrozenTrial) -> TrialRow:
    """One trial as the report's table shows it."""
    recorded = TrialRecord.of(trial)
    outcome = _outcome(trial, recorded)
    return TrialRow(
        number=trial.number,
        outcome=outcome,
        kind=_kind(recorded),
        engine_args=dict(recorded.engine_args),
        value=trial.value if outcome in (FEASIBLE, INFEASIBLE) else None,
        figures=recorded.figures,
        constraints=dict(recorded.constraints),
        reason=recorded.reason or "",
        timings_s=recorded.timings_s,
        points=recorded.points,
    )


def rows_of(trials: Iterable[FrozenTrial]) -> tuple[TrialRow, ...]:
    """Every trial as a table row, by trial number."""
    return tuple(sorted((row_of(t) for t in trials), key=lambda r: r.number))


def measured_by(trials: Iterable[FrozenTrial]) -> tuple[str, ...]:
    """Which tuner build measured the trials, with which vLLM on which device, one line each in
    order of first trial: ``tuner 0.2.0 (commit 1a2b3c4), vLLM 0.26.0, NVIDIA H200: trials 0 to
    7``; a trial of a build that recorded none reads ``tuner (build not recorded)``."""
    seen: dict[tuple[str, str, str], list[int]] = {}
    for trial in sorted(trials, key=lambda t: t.number):
        record = TrialRecord.of(trial)
        if not record.measured_on and record.tuner_build is None:
            continue  # never started (claimed, then stopped): nothing measured it
        built = record.tuner_build
        key = (
            f"tuner {built}" if built else "tuner (build not recorded)",
            f"vLLM {record.measured_on.get(VLLM_VERSION, '?')}",
            record.measured_on.get(DEVICE, "?"),
        )
        seen.setdefault(key, []).append(trial.number)
    return tuple(f"{', '.join(key)}: {_numbers(numbers)}" for key, numbers in seen.items())


def _numbers(numbers: Sequence[int]) -> str:
    """``trial 3``, ``trials 0 to 7`` (consecutive), else ``trials 0, 2, 5``."""
    if len(numbers) == 1:
        return f"trial {numbers[0]}"
    if numbers[-1] - numbers[0] == len(numbers) - 1:
        return f"trials {numbers[0]} to {numbers[-1]}"
    return "trials " + ", ".join(map(str, numbers))


def searched_parameters(trials: Iterable[FrozenTrial]) -> tuple[Parameter, ...]:
    """The parameters the search drew, in the order first seen, from Optuna's distributions."""
    found: dict[str, Parameter] = {}
    for trial in trials:
        for name, dist in trial.distributions.items():
            if name in found:
                continue
            choices = getattr(dist, "choices", None)
            numeric = choices is None
            found[name] = Parameter(name, numeric, bool(getattr(dist, "log", False)) and numeric)
    return tuple(found.values())


def recorded_slos(study_attrs: Mapping[str, Any]) -> dict[str, float]:
    """The SLOs in the fingerprint ``tuner run`` recorded on the study (``WORKLOAD_ATTR``), the
    error rate's last; empty for a study recorded without them (then see ``slo_limits``)."""
    workload = study_attrs.get(WORKLOAD_ATTR)
    if not isinstance(workload, Mapping) or not isinstance(workload.get("slos"), Mapping):
        return {}
    limits = {str(m): float(v) for m, v in workload["slos"].items() if isinstance(v, int | float)}
    if isinstance(workload.get("max_error_rate"), int | float):
        limits["error_rate"] = float(workload["max_error_rate"])
    return {metric: limits[metric] for metric in sorted(limits, key=_slo_rank)}


def slo_limits(rows: Sequence[TrialRow]) -> dict[str, float]:
    """Each SLO the trials were held to, recovered from the latest trial that measured it.

    Not for a capacity study: its trials' one constraint is whether some rate met every SLO.

    ``score`` set each constraint to ``(value - limit) / limit``, so ``limit`` is
    ``value / (1 + constraint)``; the error rate's is ``rate - max_error_rate``.
    """
    limits: dict[str, float] = {}
    for row in sorted(rows, key=lambda r: (r.outcome in (FEASIBLE, INFEASIBLE), r.number)):
        for name, excess in row.constraints.items():
            if name.startswith("slo_"):
                metric = name.removeprefix("slo_")
                value = row.figure(metric)
                if value is not None and excess > -1:
                    limits[metric] = float(f"{value / (1 + excess):.6g}")
            elif name == "error_rate" and row.figure("error_rate") is not None:
                limits["error_rate"] = float(f"{row.figures['error_rate'] - excess:.6g}")
    return {metric: limits[metric] for metric in sorted(limits, key=_slo_rank)}


def _slo_rank(metric: str) -> tuple[int, str]:
    if metric in SLO_ORDER:
        return SLO_ORDER.index(metric), metric
    return len(SLO_ORDER) + (metric == "error_rate"), metric


def value_of(row: TrialRow, parameter: str) -> Any:
    """The value the trial ran ``parameter`` at; None where it was left to vLLM's default."""
    return row.engine_args.get(parameter)


def landscape(
    rows: Sequence[TrialRow], parameter: str, metric: str
) -> dict[str, tuple[Point, ...]]:
    """The trials that have ``metric``, by series, against ``parameter``.

    A pruned trial's figure is what it had reached when it was stopped (a lower bound); it has
    no value, so it is not in the value's landscape.
    """
    series: dict[str, list[Point]] = {name: [] for name in SERIES}
    for row in rows:
        y = row.figure(metric)
        if row.outcome in series and y is not None:
            series[row.outcome].append(Point(row.number, value_of(row, parameter), y))
    return {name: tuple(points) for name, points in series.items()}


def history(
    rows: Sequence[TrialRow], objective: StudyObjective = LATENCY_OBJECTIVE
) -> tuple[HistoryStep, ...]:
    """Each trial in order, with the best feasible value found up to it, as the study's
    ``objective`` ranks them (the lowest score, or the highest capacity)."""
    best: float | None = None
    steps = []
    for row in sorted(rows, key=lambda r: r.number):
        value = row.value
        if row.outcome == FEASIBLE and value is not None:
            best = value if best is None or objective.better(value, best) else best
        steps.append(HistoryStep(row.number, value, row.outcome, best))
    return tuple(steps)


def cost(rows: Sequence[TrialRow]) -> tuple[CostBar, ...]:
    """Where each trial's time went, for the trials that recorded their timings."""
    bars = []
    for row in rows:
        total_s = row.seconds(TRIAL_S)
        if total_s is None:
            continue
        parts = tuple(row.seconds(phase) or 0.0 for phase, _ in COST_PARTS)
        bars.append(CostBar(row.number, parts, max(0.0, total_s - sum(parts))))
    return tuple(bars)


def not_measurement_share(bars: Sequence[CostBar]) -> float | None:
    """The share of the trials' time that was not the measurement window."""
    total_s = sum(bar.total_s for bar in bars)
    return 1 - sum(bar.window_s for bar in bars) / total_s if total_s > 0 else None


@dataclass(frozen=True)
class Configuration:
    """The configuration to serve: the file ``tuner run`` wrote, or the trial's arguments."""

    path: Path
    text: str
    written: bool  # the file exists (else ``text`` is the chosen trial's engine arguments)
    trial: int | None  # the trial the file says it came from


@dataclass(frozen=True)
class StudyReport:
    """Everything the page shows, read from the study and the configuration file."""

    name: str
    storage: str
    rows: tuple[TrialRow, ...]
    parameters: tuple[Parameter, ...]
    slos: dict[str, float]
    # The trial ``tuner.study.result.choice.choose`` stands for the chosen configuration (the median
    # measurement of the best feasible one, else of the closest); None if none served.
    chosen: int | None
    meets_slos: bool
    baseline: int | None
    configuration: Configuration | None
    # What the baseline is called: vLLM's defaults, or the spec's own (``your configuration``).
    baseline_name: str = VLLM_DEFAULTS
    objective: StudyObjective = LATENCY_OBJECTIVE
    # Every measurement of the chosen configuration, its first trial first (one: measured once).
    measurements: tuple[int, ...] = ()
    # What the confirm step found, as ``tuner run`` prints it and the YAML header carries it.
    confirmation: tuple[str, ...] = ()
    feasible_configurations: int = 0  # configurations (first trials) that met every SLO
    # Where vLLM's defaults are kept (``choice.DEFAULTS``): why, and the closest searched
    # configuration's first trial.
    kept_because: str = ""
    # Why a searched configuration was written unconfirmed (``choice.UNCONFIRMED``: it met the
    # SLOs where the baseline did not, with no fresh measurement to test it); else "".
    unconfirmed_because: str = ""
    closest: int | None = None
    # Where the chosen trial's time went, then the baseline's where it is another trial, with
    # the reading where vLLM's defaults are kept (``tuner.study.measure.time_spent``), as
    # ``tuner run`` says it of the chosen trial.
    time_spent: tuple[str, ...] = ()
    # Which tuner build measured which trials, with which vLLM on which device (``measured_by``).
    measured_by: tuple[str, ...] = ()
