"""One trial as tuner records it on an Optuna study: a typed ``TrialRecord`` read from a
``FrozenTrial``, and the one place that writes a trial's user attributes.

A trial's user attributes are what optuna-dashboard shows and what ``tuner run``, ``tuner
report`` and the configuration written read back. Every attribute name lives here: the rest of
tuner writes through ``started``, ``measured``, ``give_reason`` and ``Queued.attrs``, and reads
a trial through ``TrialRecord.of`` (``Queued.of`` while it is measured), never through a key of
its own. The names are those studies already hold, so a study written by an earlier tuner
reads the same (``RATES_ATTR`` keeps the name it was first stored under).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from optuna.trial import FrozenTrial, TrialState

from tuner import build
from tuner.load.health import CLIENT_BEHIND

# What the trial is: vLLM's defaults (``True``), the spec's candidate (its index), a
# re-measurement (the number of the trial it repeats), why the incumbent search proposed it.
BASELINE_ATTR = "baseline"
# Set on the baseline where the spec names one of its own (``baseline``: the configuration a
# team runs today, say): that trial is not vLLM's defaults, and the verdict says so.
SPEC_BASELINE_ATTR = "baseline_from_spec"
# Set on the candidate the spec gives as ``{}``: vLLM's defaults, beside the spec's baseline.
DEFAULTS_CANDIDATE_ATTR = "candidate_is_defaults"
CANDIDATE_ATTR = "candidate"
CONFIRMS_ATTR = "confirms"
# A fresh measurement of the confirmation of finalist trial N (its own or the baseline's).
FRESH_ATTR = "fresh_for"
MOVE_ATTR = "move"
# The layout a reference point was queued at (``TxD``, ``tuner.study.plan.layouts.Layout.name``):
# the baseline and each candidate are measured once per layout. The trial's engine arguments
# hold it too (``tensor-parallel-size``, ``data-parallel-size``).
LAYOUT_ATTR = "layout"
# Who measured it (``tuner.study.trials.workers``), on what, with which engine arguments.
WORKER_ATTR = "worker"
# Until when (Unix seconds) its worker holds it (``tuner.study.trials.lease``), and where it
# runs: the host and the GPUs (nvidia-smi's indices and UUIDs) it was measured on.
LEASE_ATTR = "lease_until"
PLACE_ATTR = "placement"
VLLM_VERSION = "vllm_version"
DEVICE = "device"
# The tuner build that measured the trial (``tuner.build.describe``: version and commit).
TUNER_ATTR = "tuner_build"
MEASURED_ON = (VLLM_VERSION, DEVICE)
ARGS_ATTR = "engine_args"
# How it ended: whether it met the SLOs, why not or why it stopped, the engine log's tail.
FEASIBLE_ATTR = "feasible"
REASON_ATTR = "reason"
LOG_ATTR = "log_tail"
# A phase's seconds (``TrialOutcome.timings``: ``window_s``) are kept as ``time_window_s``.
TIME_PREFIX = "time_"
# What vLLM's log said of its compile (``tuner.engine.startup.compile_cache``'s facts).
COMPILE_KEY_ATTR = "compile_key"
CACHE_HIT_ATTR = "compile_cache_hit"
# A capacity trial's figures: its capacity (the highest rate that met every SLO), or the gate
# it fell below (one resolution step above the best capacity so far), whether the search
# resolved it, how many rates it measured (each a window of the trace replayed at one rate) and
# the one it started at.
CAPACITY_ATTR = "capacity_req_per_s"
BELOW_ATTR = "capacity_below_req_per_s"
RESOLVED_ATTR = "capacity_resolved"
RATES_ATTR = "capacity_windows"
START_ATTR = "capacity_start_req_per_s"
# Its rates, each with what it measured, and vLLM's defaults' one window at another
# configuration's capacity.
POINTS_ATTR = "capacity_points"
COMPARED_ATTR = "capacity_compared_point"
# What a baseline is called in a verdict: vLLM's defaults (plural), or the spec's own.
VLLM_DEFAULTS = "vLLM's defaults"
YOUR_CONFIGURATION = "your configuration"
# The engine log's tail kept on a trial, in characters.
LOG_TAIL_CHARS = 4000

# The attributes that are not figures the trial measured.
_OWN = frozenset(
    {
        BASELINE_ATTR, SPEC_BASELINE_ATTR, DEFAULTS_CANDIDATE_ATTR, CANDIDATE_ATTR,
        CONFIRMS_ATTR, FRESH_ATTR, MOVE_ATTR, LAYOUT_ATTR, WORKER_ATTR, LEASE_ATTR, PLACE_ATTR,
        TUNER_ATTR, *MEASURED_ON,
        ARGS_ATTR, FEASIBLE_ATTR, REASON_ATTR, LOG_ATTR, COMPILE_KEY_ATTR, CACHE_HIT_ATTR,
        POINTS_ATTR, COMPARED_ATTR,
    }
)  # fmt: skip
# Every name this module owns, for the test that finds them nowhere else.
NAMES = _OWN | {CAPACITY_ATTR, BELOW_ATTR, RESOLVED_ATTR, RATES_ATTR, START_ATTR}


class Writable(Protocol):
    """An Optuna trial being measured (``optuna.Trial``), or one reopened by its id."""

    def set_user_attr(self, key: str, value: Any) -> None: ...

    def set_constraint(self, key: str, value: float) -> None: ...


class Attributed(Protocol):
    """A trial whose user attributes can be read: a ``FrozenTrial``, or an asked
    ``optuna.Trial``."""

    @property
    def user_attrs(self) -> dict[str, Any]: ...


class Constrained(Protocol):
    """A score as ``measured`` records it: one entry per SLO or check, above 0 where missed."""

    @property
    def constraints(self) -> Mapping[str, float]: ...


class Outcome(Protocol):
    """What ``measured`` records of a trial (``tuner.study.measure.trial.TrialOutcome``): the
    store sits below the measuring, so it names the fields it reads, not the class."""

    @property
    def score(self) -> Constrained: ...
    @property
    def metrics(self) -> Mapping[str, float]: ...
    @property
    def timings(self) -> Mapping[str, float]: ...
    @property
    def compile_cache(self) -> Mapping[str, str | bool]: ...
    @property
    def feasible(self) -> bool: ...
    @property
    def reason(self) -> str | None: ...
    @property
    def log_tail(self) -> str: ...
    @property
    def points(self) -> tuple[Mapping[str, Any], ...]: ...
    @property
    def compared(self) -> Mapping[str, Any] | None: ...


@dataclass(frozen=True)
class Queued:
    """What a trial was queued as: the baseline (vLLM's defaults, or the spec's own
    ``baseline`` where ``spec_baseline``), the spec's candidate ``candidate``, a re-measurement
    of trial ``confirms`` (``fresh``: one of the confirmation of finalist trial ``fresh``), the
    incumbent search's ``move``; none of them for a trial the sampler drew. A reference point
    (the baseline, a candidate) queued by a run on a layout names it (``layout``, ``TxD``).
    Readable while the trial is measured."""

    baseline: bool = False
    candidate: int | None = None
    confirms: int | None = None
    move: str | None = None
    fresh: int | None = None
    spec_baseline: bool = False
    defaults_candidate: bool = False
    layout: str | None = None

    @classmethod
    def of(cls, trial: Attributed) -> Queued:
        attrs = trial.user_attrs
        return cls(
            baseline=bool(attrs.get(BASELINE_ATTR)),
            candidate=_int(attrs.get(CANDIDATE_ATTR)),
            confirms=_int(attrs.get(CONFIRMS_ATTR)),
            move=_str(attrs.get(MOVE_ATTR)),
            fresh=_int(attrs.get(FRESH_ATTR)),
            spec_baseline=bool(attrs.get(SPEC_BASELINE_ATTR)),
            defaults_candidate=bool(attrs.get(DEFAULTS_CANDIDATE_ATTR)),
            layout=_str(attrs.get(LAYOUT_ATTR)),
        )

    @property
    def reference(self) -> bool:
        """vLLM's defaults or a candidate: measured in full, never pruned."""
        return self.baseline or self.candidate is not None

    def attrs(self) -> dict[str, Any]:
        """As ``Study.enqueue_trial``'s ``user_attrs``."""
        named = {
            BASELINE_ATTR: self.baseline or None,
            CANDIDATE_ATTR: self.candidate,
            CONFIRMS_ATTR: self.confirms,
            MOVE_ATTR: self.move,
            FRESH_ATTR: self.fresh,
            SPEC_BASELINE_ATTR: (self.baseline and self.spec_baseline) or None,
            DEFAULTS_CANDIDATE_ATTR: (self.candidate is not None and self.defaults_candidate)
            or None,
            LAYOUT_ATTR: self.layout if self.reference else None,
        }
        return {key: value for key, value in named.items() if value is not None}


@dataclass(frozen=True)
class Placement:
    """Where a trial was measured: the ``host`` (as ``tuner.study.trials.workers`` names it)
    and the GPUs its server saw, by nvidia-smi's index and UUID (none on a CPU)."""

    host: str
    gpu_indices: tuple[int, ...] = ()
    gpu_uuids: tuple[str, ...] = ()

    @classmethod
    def of_attr(cls, value: Any) -> Placement | None:
        """The placement a trial recorded; None where it recorded none (or not this shape)."""
        if not isinstance(value, Mapping) or not isinstance(value.get("host"), str):
            return None
        indices = tuple(i for i in value.get("gpu_indices") or () if _int(i) is not None)
        uuids = tuple(u for u in value.get("gpu_uuids") or () if isinstance(u, str))
        return cls(value["host"], indices, uuids)

    def as_attr(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "gpu_indices": list(self.gpu_indices),
            "gpu_uuids": list(self.gpu_uuids),
        }

    @property
    def device(self) -> tuple[str, tuple[str, ...]]:
        """What two measurements must share to be compared as a pair: the host and the GPUs'
        UUIDs (a GPU's index may name another GPU under another ``CUDA_VISIBLE_DEVICES``)."""
        return (self.host, self.gpu_uuids)

    def __str__(self) -> str:
        gpus = ", ".join(
            f"GPU {i} ({u})" for i, u in zip(self.gpu_indices, self.gpu_uuids, strict=False)
        )
        return f"{self.host}, {gpus}" if gpus else self.host


@dataclass(frozen=True)
class TrialRecord:
    """A finished or running trial as tuner recorded it: Optuna's number, state, value and
    constraints (by name, above 0: missed), and tuner's own fields.

    ``figures``: every figure the trial measured (``TrialOutcome.metrics``), by the replay's
    names (``ttft_p95_s``, ``client_behind``, a capacity trial's ``CAPACITY_ATTR``...), what
    ``tuner.study.measure.scoring`` judges; ``timings_s``: its phases' seconds, by
    ``TrialOutcome.timings``'s names (``engine_healthy_s``, ``window_s``, ``trial_s``). A field
    the trial did not record is None, empty or False.
    """

    number: int
    state: TrialState
    value: float | None
    constraints: Mapping[str, float]
    engine_args: Mapping[str, Any]
    baseline: bool
    spec_baseline: bool
    candidate: int | None
    defaults_candidate: bool
    confirms: int | None
    move: str | None
    fresh: int | None
    worker: str | None
    # Until when (Unix seconds) its worker holds it; None where it holds no lease.
    lease_until: float | None
    placement: Placement | None
    measured_on: Mapping[str, str]
    # The tuner build that measured it (``tuner.build.describe``); None where it recorded none.
    tuner_build: str | None
    feasible: bool
    reason: str | None
    log_tail: str
    figures: Mapping[str, Any]
    timings_s: Mapping[str, float]
    compile_key: str | None
    compile_cache_hit: bool | None
    points: tuple[Mapping[str, Any], ...]
    compared: Mapping[str, Any] | None

    @classmethod
    def of(cls, trial: FrozenTrial) -> TrialRecord:
        """The record of ``trial``, whatever tuner (or a test) wrote on it."""
        attrs = trial.user_attrs
        queued = Queued.of(trial)
        return cls(
            number=trial.number,
            state=trial.state,
            value=trial.value if trial.state == TrialState.COMPLETE else None,
            constraints=dict(trial.constraints),
            engine_args=dict(attrs.get(ARGS_ATTR) or {}),
            baseline=queued.baseline,
            spec_baseline=queued.baseline and queued.spec_baseline,
            candidate=queued.candidate,
            defaults_candidate=queued.candidate is not None and queued.defaults_candidate,
            confirms=queued.confirms,
            move=queued.move,
            fresh=queued.fresh,
            worker=_str(attrs.get(WORKER_ATTR)),
            lease_until=_number(attrs.get(LEASE_ATTR)),
            placement=Placement.of_attr(attrs.get(PLACE_ATTR)),
            measured_on={k: attrs[k] for k in MEASURED_ON if isinstance(attrs.get(k), str)},
            tuner_build=_str(attrs.get(TUNER_ATTR)),
            feasible=bool(attrs.get(FEASIBLE_ATTR)),
            reason=_str(attrs.get(REASON_ATTR)),
            log_tail=str(attrs.get(LOG_ATTR) or ""),
            figures={
                k: v for k, v in attrs.items() if k not in _OWN and not k.startswith(TIME_PREFIX)
            },
            timings_s={
                k.removeprefix(TIME_PREFIX): float(v)
                for k, v in attrs.items()
                if k.startswith(TIME_PREFIX) and _number(v) is not None
            },
            compile_key=_str(attrs.get(COMPILE_KEY_ATTR)),
            compile_cache_hit=(
                bool(attrs[CACHE_HIT_ATTR]) if attrs.get(CACHE_HIT_ATTR) is not None else None
            ),
            points=tuple(p for p in attrs.get(POINTS_ATTR) or () if isinstance(p, Mapping)),
            compared=_mapping(attrs.get(COMPARED_ATTR)),
        )

    @property
    def baseline_name(self) -> str:
        """What a baseline trial is called in a verdict: ``vLLM's defaults``, or ``your
        configuration`` where the spec named a baseline of its own."""
        return YOUR_CONFIGURATION if self.spec_baseline else VLLM_DEFAULTS

    @property
    def defaults_aside(self) -> str:
        """What follows a trial's number where it is the spec's ``{}`` candidate, ``trial 1
        (vLLM's defaults)``: `` (vLLM's defaults)``; else nothing."""
        return f" ({VLLM_DEFAULTS})" if self.defaults_candidate else ""

    @property
    def candidate_name(self) -> str:
        """What a candidate is called in a verdict: ``vLLM's defaults`` for the spec's ``{}``
        beside its own baseline, else ``candidate``."""
        return VLLM_DEFAULTS if self.defaults_candidate else "candidate"

    @property
    def baseline_label(self) -> str:
        """Its column in a table: ``defaults`` or ``baseline``."""
        return "baseline" if self.spec_baseline else "defaults"

    def figure(self, name: str) -> float | None:
        """The measured figure ``name`` as a float, or None where it has none (or not a
        number)."""
        return _number(self.figures.get(name))

    @property
    def capacity_req_per_s(self) -> float | None:
        """A capacity trial's capacity; None for a latency trial or one stopped at its gate."""
        return self.figure(CAPACITY_ATTR)

    @property
    def below_req_per_s(self) -> float | None:
        """The gate a searched capacity trial failed at: its capacity is below it."""
        return self.figure(BELOW_ATTR)

    @property
    def rates_measured(self) -> int:
        """How many rates a capacity trial measured (0 for a latency trial)."""
        return int(self.figure(RATES_ATTR) or 0)

    @property
    def measured_capacity(self) -> bool:
        """Whether it is a capacity trial: it kept a capacity or the gate it fell below."""
        return CAPACITY_ATTR in self.figures or BELOW_ATTR in self.figures

    @property
    def client_behind(self) -> bool:
        """Whether tuner's client fell behind: its figures are the client's, not the
        configuration's."""
        return bool(self.figures.get(CLIENT_BEHIND))


def started(
    trial: Writable, worker: str, engine_args: Mapping[str, Any], machine: Mapping[str, str]
) -> None:
    """Record who measures ``trial``, with which engine arguments, on what ``machine`` (the
    ``MEASURED_ON`` facts of ``tuner.study.trials.fingerprint.measured_on``), by which tuner
    build."""
    claimed(trial, worker)
    trial.set_user_attr(TUNER_ATTR, build.describe())
    trial.set_user_attr(ARGS_ATTR, dict(engine_args))
    for key, value in machine.items():
        trial.set_user_attr(key, value)


def claimed(trial: Writable, worker: str) -> None:
    """Record the worker that asked for ``trial`` (a host, a pid and a start time)."""
    trial.set_user_attr(WORKER_ATTR, worker)


def leased(trial: Writable, until: float) -> None:
    """Record that ``trial``'s worker holds it until ``until`` (Unix seconds)."""
    trial.set_user_attr(LEASE_ATTR, until)


def placed(trial: Writable, placement: Placement) -> None:
    """Record the host and GPUs ``trial`` is measured on."""
    trial.set_user_attr(PLACE_ATTR, placement.as_attr())


def measured(trial: Writable, outcome: Outcome) -> None:
    """Record what ``trial`` measured: its figures, phase times, compile facts, verdict, why,
    the engine log's tail, a capacity trial's rates, and its score's constraints (Optuna's own,
    so that optuna-dashboard shows them and TPE learns the infeasible region)."""
    for name, value in outcome.metrics.items():
        trial.set_user_attr(name, value)
    for name, seconds in outcome.timings.items():
        trial.set_user_attr(TIME_PREFIX + name, seconds)
    for fact, said in outcome.compile_cache.items():
        trial.set_user_attr(fact, said)
    trial.set_user_attr(FEASIBLE_ATTR, outcome.feasible)
    if outcome.reason:
        give_reason(trial, outcome.reason)
    if outcome.log_tail:
        trial.set_user_attr(LOG_ATTR, outcome.log_tail[-LOG_TAIL_CHARS:])
    if outcome.points:
        trial.set_user_attr(POINTS_ATTR, [dict(point) for point in outcome.points])
    if outcome.compared is not None:
        trial.set_user_attr(COMPARED_ATTR, dict(outcome.compared))
    for name, value in outcome.score.constraints.items():
        trial.set_constraint(name, value)


def give_reason(trial: Writable, reason: str) -> None:
    """Record why ``trial`` is infeasible, stopped or left (shown beside it everywhere)."""
    trial.set_user_attr(REASON_ATTR, reason)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _mapping(value: Any) -> Mapping[str, Any] | None:
    return dict(value) if isinstance(value, Mapping) else None
