"""Calibration: the rate a latency study replays its window at, from what this machine serves.

A study whose spec says ``time_scale: auto`` does not replay the trace at a speed written for
some other machine. Before its first trial, tuner starts vLLM's defaults (the study's baseline)
once and searches the highest rate of the window they carry within the SLOs (the capacity
search of ``tuner.study.capacity.probes``, coarser: ``RESOLUTION``, at most ``MAX_RATES``
rates of ``replay_s`` seconds each). Every trial then replays the window at ``load`` times that
rate, for at most ``replay_s`` seconds (longer where that would hold fewer than
``MIN_REPLAY_REQUESTS``): a load the defaults carry with room to spare on this machine, slow or
fast, where configurations that serve worse than the defaults are seen to queue.

The calibration is kept in the study (``CALIBRATION_ATTR``), so a resumed study replays what
its first trials replayed; the time scale it sets is part of the study's fingerprint. Whether a
run calibrates, and the factor its trials replay at before and after, is ``TimeScale``'s to say.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from tuner.study.capacity.probes import CapacitySettings
from tuner.study.capacity.rate_search import RateSearch
from tuner.study.measure.trial import TrialOutcome, TrialSetup, run_trial
from tuner.study.plan.spec import AUTO, StudySpec
from tuner.study.setup.objective import StudyObjective
from tuner.traces.model import Request

# The study user attribute that holds the calibration.
CALIBRATION_ATTR = "calibration"
# Coarser than a capacity study's search: the rate only needs to sit well below the capacity.
RESOLUTION = 0.25
MAX_RATES = 8
# A trial's replay holds at least this many requests, however slow the calibrated rate: fewer
# say too little of a p95. Where ``replay_s`` at that rate holds fewer, the replay is longer.
MIN_REPLAY_REQUESTS = 20


class CalibrationFailed(Exception):
    """vLLM's defaults did not serve on this machine, so there is nothing to calibrate from."""

    def __init__(self, reason: str, log_tail: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.log_tail = log_tail


@dataclass(frozen=True)
class Calibration:
    """What vLLM's defaults carried of the window, and the rate the study replays it at.

    ``capacity_req_per_s`` is 0 where no rate tried met the SLOs; the study then replays at
    ``load`` times the lowest rate tried (``lowest_req_per_s``).
    """

    capacity_req_per_s: float
    lowest_req_per_s: float
    load: float
    window_req_per_s: float
    replay_s: float
    windows: int
    seconds: float
    # Each rate the calibration measured: rate, passed, and why it failed, as a trial keeps them.
    points: tuple[Mapping[str, Any], ...] = ()

    @property
    def rate_req_per_s(self) -> float:
        base = self.capacity_req_per_s or self.lowest_req_per_s
        return self.load * base

    @property
    def time_scale(self) -> float:
        """The factor on the window's arrival times that gives ``rate_req_per_s``."""
        return self.window_req_per_s / self.rate_req_per_s

    def as_attr(self) -> dict[str, Any]:
        """The calibration as the study keeps it (JSON)."""
        return {**asdict(self), "points": [dict(point) for point in self.points]}

    @classmethod
    def from_attr(cls, attr: Mapping[str, Any]) -> Calibration:
        return cls(
            capacity_req_per_s=float(attr["capacity_req_per_s"]),
            lowest_req_per_s=float(attr["lowest_req_per_s"]),
            load=float(attr["load"]),
            window_req_per_s=float(attr["window_req_per_s"]),
            replay_s=float(attr["replay_s"]),
            windows=int(attr["windows"]),
            seconds=float(attr["seconds"]),
            points=tuple(attr.get("points", ())),
        )

    def describe(self) -> str:
        if self.capacity_req_per_s > 0:
            carried = (
                f"vLLM's defaults carry {self.capacity_req_per_s:.3g} req/s of this window "
                "within the SLOs on this machine"
            )
        else:
            carried = (
                "vLLM's defaults met the SLOs at none of the rates tried on this machine "
                f"(the lowest, {self.lowest_req_per_s:.3g} req/s)"
            )
        return (
            f"calibrated ({self.windows} rates, {self.seconds:.0f} s): {carried}; every trial "
            f"replays the window at {self.load:g} x that, {self.rate_req_per_s:.3g} req/s "
            f"(time scale {self.time_scale:.3g}), for at most {self.replay_s:.3g} s"
        )


@dataclass(frozen=True)
class TimeScale:
    """A run's ``time_scale`` as given (the command line's, else the spec's): a factor on the
    trace's arrival times, or ``auto``. What says whether the run calibrates, and the factor
    every trial replays the window at; nothing else reads ``auto``."""

    given: float | str

    def calibrates(self, objective: StudyObjective, request_trace: bool) -> bool:
        """Whether the run measures the rate it replays at on this machine: ``auto``, of a
        request trace (a closed loop has no rate to set), in a study whose objective calibrates
        (a latency study's)."""
        return self.given == AUTO and request_trace and objective.calibrates

    def factor(self, found: Calibration | None = None) -> float:
        """The factor on the window's arrival times: the number given; for ``auto``, the
        calibration's (``found``), else 1, the trace's own speed (before a calibration, and in
        a run that does not calibrate)."""
        if self.given != AUTO:
            return float(self.given)
        return 1.0 if found is None else found.time_scale


def settings(
    requests: Sequence[Request], period_s: float, replay_s: float, client_tolerance_s: float
) -> CapacitySettings:
    """How the calibration searches: the window as the trace has it (``period_s``), rates of
    ``replay_s`` seconds, from the window's own rate."""
    return CapacitySettings(
        requests=requests,
        period_s=period_s,
        probe_s=replay_s,
        resolution=RESOLUTION,
        max_probes=MAX_RATES,
        client_tolerance_s=client_tolerance_s,
        # A latency study's calibration sets a load, not a verdict: its rates keep their
        # seconds and judge every request (a capacity study's lengthen to be judged on more).
        min_requests=0,
        steady=False,
    )


def from_outcome(outcome: TrialOutcome, search: CapacitySettings, load: float) -> Calibration:
    """The calibration that ``search`` (``settings``) found on vLLM's defaults; a trial replays
    for ``search.probe_s`` seconds, or long enough for ``MIN_REPLAY_REQUESTS`` at its rate.
    ``CalibrationFailed`` where the engine did not serve (no rate measured)."""
    if not outcome.points:
        raise CalibrationFailed(outcome.reason or "vLLM's defaults did not serve", outcome.log_tail)
    rates = [float(point["rate_req_per_s"]) for point in outcome.points]
    lowest = min(rates)
    capacity = float(outcome.score.value)  # a rate search's value: the capacity
    rate = load * (capacity or lowest)
    return Calibration(
        capacity_req_per_s=capacity,
        lowest_req_per_s=lowest,
        load=load,
        window_req_per_s=search.window_req_per_s,
        replay_s=max(search.probe_s, MIN_REPLAY_REQUESTS / rate),
        windows=len(rates),
        seconds=float(outcome.timings.get("trial_s", 0.0)),
        points=tuple(outcome.points),
    )


def measure(
    setup: TrialSetup, search: CapacitySettings, spec: StudySpec, workdir: Path
) -> Calibration:
    """Start vLLM's defaults once, search what they carry, stop them: the spec's baseline, or
    where the spec names a baseline of its own (your configuration), its ``{}`` candidate
    beside it (``StudySpec.defaults_candidate``) where it has one."""
    calibrating = replace(setup, measure=RateSearch(search))
    outcome = run_trial(defaults_args(spec), calibrating, workdir)
    return from_outcome(outcome, search, spec.calibrate_load)


def defaults_args(spec: StudySpec) -> dict[str, Any]:
    """The engine arguments the calibration starts: vLLM's defaults as the study runs them."""
    index = spec.defaults_candidate  # only ever beside a baseline of the spec's own
    if index is not None:
        return {**spec.engine_args, **spec.candidates[index]}
    return {**spec.engine_args, **spec.baseline}


def stored(study_attrs: Mapping[str, Any]) -> Calibration | None:
    """The calibration a study holds, if any."""
    attr = study_attrs.get(CALIBRATION_ATTR)
    return None if attr is None else Calibration.from_attr(attr)
