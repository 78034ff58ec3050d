"""What a study optimises: ``StudyObjective``, the few things a study asks of it, and its
implementations, registered in ``OBJECTIVES`` under the spec's ``objective_mode``.

- ``Latency``: the lowest score at the window's rate. A trial replays the window once
  (``WindowReplay``); the pruner stops one that is far off; ``time_scale: auto`` calibrates the
  rate on this machine.
- ``Capacity``: the highest rate one server carries within every SLO. A trial searches rates on
  one engine (``RateSearch``, ``tuner.study.capacity.rate_search``), starting from what the study
  measured nearest, and a searched one is first measured one resolution step above the best
  capacity so far; nothing
  is pruned or calibrated.
- ``Goodput``: the highest rate at which at least the spec's ``goodput_share`` of the requests
  meet every SLO, each request on its own figures (``tuner.study.measure.judge.met_share``):
  searched over rates as capacity is, each rate judged by that share instead of percentiles.

An objective holds no words: what ``tuner run``, the YAML header and ``tuner report`` say of it
are presenters beside their readers, registered under the same mode
(``tuner.study.result.words``, ``tuner.report.presenters``). It alone reads the direction:
configurations are ranked (``rank``, ``better``, ``gain``, ``best_first``) through it. The rest
of tuner asks the objective (``of_spec``, ``of_study``, ``of_trial``) rather than testing which
one it is.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any, ClassVar

import optuna
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial

from tuner.study.capacity.probes import CapacitySettings
from tuner.study.capacity.rate_search import RateSearch
from tuner.study.measure.judge import GOODPUT_SHARE
from tuner.study.measure.next_steps import Offered
from tuner.study.measure.scoring import FAILED_SCORE
from tuner.study.measure.trial import Measure, WindowReplay
from tuner.study.plan.spec import CAPACITY, GOODPUT, LATENCY, OBJECTIVE_MODES, StudySpec
from tuner.study.store.record import CAPACITY_ATTR, TrialRecord

# The value of each objective, as the study names it (optuna-dashboard shows the name).
SCORE_NAME = "score"
GOODPUT_NAME = "goodput_req_per_s"


class StudyObjective(ABC):
    """What a study optimises (``mode``: the spec's ``objective_mode``), in the study's terms.

    ``direction`` and ``metric`` are read when the study is created (``open_study``: Optuna's
    direction, and the value's name) and again to know the objective a stored study was made
    for (``of_study``). Before the trials, ``fingerprint`` says what of the spec enters the
    study's fingerprint and ``measure`` how every trial measures; ``prunes`` and
    ``calibrates`` say whether the pruner runs and ``time_scale: auto`` calibrates. After a
    trial, ``served`` says whether it measured anything to rank it by, and ``recorded``
    whether a trial's record is of this objective (``of_trial``). ``searches_rates``: a trial
    searches the rates it is measured at, its value one of them (the confirm step then holds
    the baseline at the finalist's rate, and a request trace is needed).
    """

    mode: ClassVar[str]
    direction: ClassVar[StudyDirection]
    metric: ClassVar[str]
    prunes: ClassVar[bool] = False
    calibrates: ClassVar[bool] = False
    searches_rates: ClassVar[bool] = False

    @abstractmethod
    def measure(self, spec: StudySpec, requests: Sequence[Any], offered: Offered | None) -> Measure:
        """How each trial of the study measures (``TrialSetup.measure``); ``offered`` is None
        for a concurrency trace."""

    @abstractmethod
    def fingerprint(self, spec: StudySpec) -> dict[str, Any]:
        """What of the spec, besides what every study records, changes what a trial measures."""

    @abstractmethod
    def served(self, trial: FrozenTrial) -> bool:
        """Whether a completed trial measured figures to rank it by."""

    @abstractmethod
    def recorded(self, record: TrialRecord) -> bool:
        """Whether a trial's record is one this objective measured; true of one objective."""

    def measure_s(self, spec: StudySpec, replay_s: float) -> float:
        """About how long a trial measures once its engine is up, before any trial was timed
        (``replay_s``: the window as replayed): the window itself."""
        return replay_s

    @property
    def maximize(self) -> bool:
        """Whether a higher value is better: the study's direction, read here only."""
        return self.direction == StudyDirection.MAXIMIZE

    def rank(self, value: float) -> float:
        """A trial's value as a rank: lower is better, whichever the direction."""
        return -value if self.maximize else value

    def better(self, value: float, than: float) -> bool:
        """Whether ``value`` is better than ``than``."""
        return self.rank(value) < self.rank(than)

    def gain(self, value: float, over: float) -> float:
        """How much better ``value`` is than ``over``, as a fraction of ``over`` (negative:
        worse); 0 where ``over`` is 0."""
        if not over:
            return 0.0
        return (self.rank(over) - self.rank(value)) / abs(over)

    def upward(self, value: float) -> float:
        """A positive value as one whose ratios say how many times better: itself where higher
        is better, its inverse where lower is (a score half as high is 2x better)."""
        return value if self.maximize else 1.0 / value

    def best_first(self, trials: Iterable[FrozenTrial]) -> list[FrozenTrial]:
        """Completed trials from the best value to the worst: ordered by value and number, and
        read from the best end (of equal values, the later trial first where higher is
        better)."""
        ordered = sorted(trials, key=lambda t: (t.value, t.number))
        return ordered[::-1] if self.maximize else ordered


class Latency(StudyObjective):
    """The lowest score at the window's rate (``tuner.study.measure.scoring``), minimized."""

    mode = LATENCY
    direction = StudyDirection.MINIMIZE
    metric = SCORE_NAME
    prunes = True
    calibrates = True

    def measure(self, spec: StudySpec, requests: Sequence[Any], offered: Offered | None) -> Measure:
        return WindowReplay()

    def fingerprint(self, spec: StudySpec) -> dict[str, Any]:
        # Nothing: latency studies recorded before the mode existed match.
        return {}

    def served(self, trial: FrozenTrial) -> bool:
        return trial.value != FAILED_SCORE

    def recorded(self, record: TrialRecord) -> bool:
        return not record.measured_capacity


class Capacity(StudyObjective):
    """The highest rate of the window one server carries within every SLO, maximized. A trial
    is gated at the best capacity so far instead of pruned, and searches its own rates."""

    mode = CAPACITY
    direction = StudyDirection.MAXIMIZE
    metric = CAPACITY_ATTR
    searches_rates = True

    def settings(
        self, spec: StudySpec, requests: Sequence[Any], offered: Offered
    ) -> CapacitySettings:
        """How a trial's rate search runs, from the spec."""
        return CapacitySettings(
            requests=requests,
            period_s=offered.replay_s,
            probe_s=spec.capacity_probe_s,
            resolution=spec.capacity_resolution,
            max_probes=spec.capacity_max_probes,
            client_tolerance_s=spec.client_tolerance_s,
            min_requests=spec.capacity_min_requests,
            saturate=True,
        )

    def measure(self, spec: StudySpec, requests: Sequence[Any], offered: Offered | None) -> Measure:
        assert offered is not None  # an open-loop replay: ``searches_rates``
        return RateSearch(self.settings(spec, requests, offered))

    def fingerprint(self, spec: StudySpec) -> dict[str, Any]:
        # Stored under the probe settings' earlier names, so that earlier studies still resume.
        return {
            "objective_mode": spec.objective_mode,
            "capacity_window_s": spec.capacity_probe_s,
            "capacity_resolution": spec.capacity_resolution,
            "capacity_max_windows": spec.capacity_max_probes,
            "capacity_min_requests": spec.capacity_min_requests,
        }

    def measure_s(self, spec: StudySpec, replay_s: float) -> float:
        # A search over rates: about half the probes a trial may measure.
        return spec.capacity_probe_s * spec.capacity_max_probes / 2

    def served(self, trial: FrozenTrial) -> bool:
        return bool(TrialRecord.of(trial).points)

    def recorded(self, record: TrialRecord) -> bool:
        return record.measured_capacity and GOODPUT_SHARE not in record.figures


class Goodput(Capacity):
    """The highest rate at which at least ``goodput_share`` of the window's requests meet every
    SLO on their own figures, maximized: capacity's search, each rate judged by that share."""

    mode = GOODPUT
    metric = GOODPUT_NAME

    def settings(
        self, spec: StudySpec, requests: Sequence[Any], offered: Offered
    ) -> CapacitySettings:
        shared = super().settings(spec, requests, offered)
        return replace(shared, goodput_share=spec.goodput_share)

    def fingerprint(self, spec: StudySpec) -> dict[str, Any]:
        return super().fingerprint(spec) | {"goodput_share": spec.goodput_share}

    def recorded(self, record: TrialRecord) -> bool:
        return GOODPUT_SHARE in record.figures


LATENCY_OBJECTIVE = Latency()
CAPACITY_OBJECTIVE = Capacity()
GOODPUT_OBJECTIVE = Goodput()
OBJECTIVES: dict[str, StudyObjective] = {
    o.mode: o for o in (LATENCY_OBJECTIVE, CAPACITY_OBJECTIVE, GOODPUT_OBJECTIVE)
}
assert tuple(OBJECTIVES) == OBJECTIVE_MODES


def of_spec(spec: StudySpec) -> StudyObjective:
    """The objective the spec's ``objective_mode`` names."""
    return OBJECTIVES[spec.objective_mode]


def of_study(study: optuna.Study) -> StudyObjective:
    """The objective a study was created for: by its metric's name, else (a study made before
    tuner named it) by its direction."""
    names = study.metric_names or []
    for objective in OBJECTIVES.values():
        if names == [objective.metric]:
            return objective
    return next(o for o in OBJECTIVES.values() if o.direction == study.direction)


def of_trial(trial: FrozenTrial) -> StudyObjective:
    """The objective a trial was measured for, from what it recorded (``recorded``)."""
    record = TrialRecord.of(trial)
    return next(o for o in OBJECTIVES.values() if o.recorded(record))
