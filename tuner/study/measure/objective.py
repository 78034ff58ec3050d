"""What a study optimises, and all that follows from it: ``StudyObjective`` and its two
implementations, registered in ``OBJECTIVES`` under the spec's ``objective_mode``.

- ``Latency``: the lowest score at the window's rate. A trial replays the window once
  (``WindowReplay``); the pruner stops one that is far off; ``time_scale: auto`` calibrates the
  rate on this machine.
- ``Capacity``: the highest rate one server carries within every SLO. A trial searches rates on
  one engine (``RateSearch``, ``tuner.study.measure.rate_search``), starting from what the study
  measured nearest, and a searched one is first measured at the best capacity so far; nothing
  is pruned or calibrated; the result says how many servers the trace's peak needs.

An objective fixes the study's direction and metric (the value optuna-dashboard shows), how a
trial measures, how a trial vLLM did not run is scored, what of the spec goes into the study's
fingerprint, and the words ``tuner run`` prints of a trial and of the result and ``tuner report``
shows. It alone reads the direction: configurations are ranked (``rank``, ``better``, ``gain``,
``best_first``) through it. The rest of tuner asks the objective (``of_spec``, ``of_study``,
``of_trial``) rather than testing which one it is.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import optuna
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial

from tuner.errors import InputError
from tuner.study.measure.capacity import CapacitySettings
from tuner.study.measure.capacity_text import (
    capacity_of,
    compared_line,
    headline,
    num,
    servers_line,
    table_rows,
)
from tuner.study.measure.outcome import Offered, next_steps
from tuner.study.measure.rate_search import RateSearch
from tuner.study.measure.record import CAPACITY_ATTR, VLLM_DEFAULTS, TrialRecord
from tuner.study.measure.scoring import FAILED_SCORE, Miss
from tuner.study.measure.trial import Measure, WindowReplay
from tuner.study.plan.spec import CAPACITY, LATENCY, OBJECTIVE_MODES, StudySpec

# The value of each objective, as the study names it (optuna-dashboard shows the name).
SCORE_NAME = "score"


class StudyObjective:
    """What a study optimises (``mode``: the spec's ``objective_mode``), its ``direction`` and
    the ``metric`` that is each trial's value, and what follows from it for a run. The base
    class is what a latency study does; an objective overrides where it differs."""

    mode: ClassVar[str]
    direction: ClassVar[StudyDirection]
    metric: ClassVar[str]
    # Whether a trial far off its SLOs is stopped early (``tuner.study.trials.search.pruner_for``),
    # and whether ``time_scale: auto`` measures the replay's rate on this machine.
    prunes: ClassVar[bool] = True
    calibrates: ClassVar[bool] = True
    # The value in words: its name, its unit after a number, and the axis that draws it.
    value_name: ClassVar[str] = SCORE_NAME
    value_unit: ClassVar[str] = ""
    value_label: ClassVar[str] = "score (lower is better)"
    # Whether a trial searches the rates it is measured at, its figures those at its value
    # (``figures_at`` says so): the report then leads with the value, shows the rates each trial
    # measured, and draws latency against offered rate.
    searches_rates: ClassVar[bool] = False
    figures_at: ClassVar[str] = ""

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

    def value_text(self, value: float) -> str:
        """A trial's value as the report's tables show it."""
        return f"{value:.3f}"

    def meets_words(self, value: float) -> str:
        """What the chosen configuration (its value ``value``) does, in the report's verdict."""
        return "meets every SLO"

    def among_words(self, count: int, confirmed: bool) -> str:
        """What the chosen configuration is best among, as the verdict's sentence goes on from
        ``meets_words``: ``count`` feasible configurations ranked by their medians
        (``confirmed``), else ``count`` feasible trials."""
        if confirmed:
            return f", with the best median score of {count} feasible {_configurations(count)}"
        return f", with the best score of the {count} feasible trials"

    def defaults_words(self, number: int, value: float) -> str:
        """What the verdict adds of vLLM's defaults (trial ``number``, its value ``value``) where
        no confirmation compared them: nothing."""
        return ""

    def check_trace(self, request_trace: bool) -> None:
        """An ``InputError`` where the objective cannot use this kind of trace."""

    def measure(self, spec: StudySpec, requests: Sequence[Any], offered: Offered | None) -> Measure:
        """How each trial of the study measures (``TrialSetup.measure``)."""
        return WindowReplay()

    def fingerprint(self, spec: StudySpec) -> dict[str, Any]:
        """What of the spec, besides what every study records, changes what a trial measures."""
        return {}

    def measure_s(self, spec: StudySpec, replay_s: float) -> float:
        """About how long a trial measures once its engine is up, before any trial was timed
        (``replay_s``: the window as replayed): the window itself."""
        return replay_s

    def served(self, trial: FrozenTrial) -> bool:
        """Whether a completed trial measured figures to rank it by."""
        return trial.value != FAILED_SCORE

    def value_words(self, trial: FrozenTrial) -> str | None:
        """The trial's value as ``tuner run``'s trial line says it."""
        return None if trial.value is None else f"score {trial.value:.3f}"

    def result_lines(
        self,
        chosen: FrozenTrial,
        other: Mapping[str, Any] | None,
        peak_req_per_s: float | None,
        other_label: str = "defaults",
    ) -> tuple[list[tuple[str, str, str]], list[str], str]:
        """What the result says besides the latency figures: rows of the end table (name, the
        chosen trial's, the other's: the defaults', or where they are kept the closest searched
        configuration's), headline lines, and where the figures were measured."""
        return [], [], "on that window, each figure the median measurement's"

    def at_one_rate(self, defaults: Sequence[FrozenTrial], name: str = VLLM_DEFAULTS) -> list[str]:
        """What vLLM's defaults (their measurements, ``defaults``) measured at the leading
        configuration's own operating point, where that differs from theirs: nothing where
        every configuration was measured at one load (the window's)."""
        return []

    def what_next(
        self,
        chosen: FrozenTrial,
        offered: Offered | None,
        spec_path: Path,
        misses: Sequence[Miss],
        capacity_command: str,
    ) -> list[str]:
        """What to try where nothing met the SLOs (``capacity_command``: the run that asks the
        capacity question of the same trace)."""
        figures = TrialRecord.of(chosen).figures
        steps = next_steps(chosen.number, figures, offered, spec_path, misses)
        if offered is not None:
            steps.append(
                "  or find the rate one server of each configuration carries within these SLOs: "
                + capacity_command
            )
        return steps


class Latency(StudyObjective):
    """The lowest score at the window's rate (``tuner.study.measure.scoring``), minimized."""

    mode = LATENCY
    direction = StudyDirection.MINIMIZE
    metric = SCORE_NAME


class Capacity(StudyObjective):
    """The highest rate of the window one server carries within every SLO, maximized."""

    mode = CAPACITY
    direction = StudyDirection.MAXIMIZE
    metric = CAPACITY_ATTR
    # A capacity trial is gated at the best capacity so far instead of pruned, and searches its
    # own rates.
    prunes = False
    calibrates = False
    value_name = "capacity"
    value_unit = " req/s"
    value_label = "capacity (req/s, higher is better)"
    searches_rates = True
    figures_at = "those at its capacity (at the lowest rate it tried, where none passed)"

    def value_text(self, value: float) -> str:
        return f"{num(value)} req/s"

    def meets_words(self, value: float) -> str:
        return f"carries {num(value)} req/s within every SLO"

    def among_words(self, count: int, confirmed: bool) -> str:
        if confirmed:
            what = f"the highest median capacity of {count} {_configurations(count)}"
        else:
            what = f"the highest capacity of the {count} trials"
        return f": {what} that met them at some rate"

    def defaults_words(self, number: int, value: float) -> str:
        return f" vLLM's defaults (trial {number}) carry {num(value)} req/s."

    def check_trace(self, request_trace: bool) -> None:
        if not request_trace:
            raise InputError(
                "a capacity study replays a request trace at rates of its choosing; a "
                "concurrency trace sets its own load (use --objective latency)"
            )

    def measure(self, spec: StudySpec, requests: Sequence[Any], offered: Offered | None) -> Measure:
        assert offered is not None  # an open-loop replay: ``check_trace``
        return RateSearch(
            CapacitySettings(
                requests=requests,
                period_s=offered.replay_s,
                rate_window_s=spec.capacity_window_s,
                resolution=spec.capacity_resolution,
                max_rates=spec.capacity_max_windows,
                client_tolerance_s=spec.client_tolerance_s,
                min_requests=spec.capacity_min_requests,
            )
        )

    def fingerprint(self, spec: StudySpec) -> dict[str, Any]:
        # Only for capacity studies: latency studies recorded before the mode existed match.
        return {
            "objective_mode": spec.objective_mode,
            "capacity_window_s": spec.capacity_window_s,
            "capacity_resolution": spec.capacity_resolution,
            "capacity_max_windows": spec.capacity_max_windows,
            "capacity_min_requests": spec.capacity_min_requests,
        }

    def measure_s(self, spec: StudySpec, replay_s: float) -> float:
        # A search over rates: about half the windows a trial may measure.
        return spec.capacity_window_s * spec.capacity_max_windows / 2

    def served(self, trial: FrozenTrial) -> bool:
        return bool(TrialRecord.of(trial).points)

    def value_words(self, trial: FrozenTrial) -> str | None:
        recorded = TrialRecord.of(trial)
        if recorded.capacity_req_per_s is not None:
            rates = recorded.rates_measured
            return f"capacity {num(recorded.capacity_req_per_s)} req/s ({rates} rates measured)"
        if recorded.below_req_per_s is not None:
            return f"capacity below {num(recorded.below_req_per_s)} req/s"
        return super().value_words(trial)

    def result_lines(
        self,
        chosen: FrozenTrial,
        other: Mapping[str, Any] | None,
        peak_req_per_s: float | None,
        other_label: str = "defaults",
    ) -> tuple[list[tuple[str, str, str]], list[str], str]:
        figures = TrialRecord.of(chosen).figures
        found = capacity_of(figures) or 0.0
        lines = [
            headline(figures, other, peak_req_per_s, other_label),
            servers_line(found, peak_req_per_s, f"trial {chosen.number}"),
        ]
        rows = table_rows(figures, other, peak_req_per_s)
        mine = f"{num(found)} req/s" if found else "the lowest rate it tried"
        where = f"each at its own capacity (this configuration at {mine}"
        if other is not None:
            theirs = capacity_of(other)
            at = f"{num(theirs)} req/s" if theirs else "the lowest rate it tried"
            where += f", {other_label} at {at}"
        return rows, lines, where + "), each the median measurement's"

    def at_one_rate(self, defaults: Sequence[FrozenTrial], name: str = VLLM_DEFAULTS) -> list[str]:
        """The last window vLLM's defaults replayed at the leading configuration's median
        capacity (the confirm step's, ``TrialRecord.compared``), in one line, with how their
        other windows at that rate went where those disagree."""
        windows: list[tuple[int, Mapping[str, Any]]] = []
        for trial in defaults:
            compared = TrialRecord.of(trial).compared
            if compared is not None:
                windows.append((trial.number, compared))
        if not windows:
            return []
        point = windows[-1][1]
        alike = [
            (n, bool(p.get("passed")))
            for n, p in windows
            if p["rate_req_per_s"] == point["rate_req_per_s"]
        ]
        return [compared_line(point, name) + _of_their_windows(alike)]

    def what_next(
        self,
        chosen: FrozenTrial,
        offered: Offered | None,
        spec_path: Path,
        misses: Sequence[Miss],
        capacity_command: str,
    ) -> list[str]:
        return [
            "next: no configuration met the SLOs at any rate down to the search's floor; relax "
            f"the SLOs in {spec_path} (or lengthen capacity_window_s) and search again under a "
            "new --study"
        ]


def _of_their_windows(windows: Sequence[tuple[int, bool]]) -> str:
    """Where the baseline replayed that rate on several engines and they disagree, how each
    went: ``; of 3 windows there, 1 met them (trial 5), 2 missed (trials 4, 8)``."""
    met = [n for n, passed in windows if passed]
    missed = [n for n, passed in windows if not passed]
    if not met or not missed:
        return ""

    def trials(numbers: list[int]) -> str:
        return f"trial{'s' if len(numbers) > 1 else ''} {', '.join(map(str, numbers))}"

    return (
        f"; of {len(windows)} windows there, {len(met)} met them ({trials(met)}), "
        f"{len(missed)} missed ({trials(missed)})"
    )


LATENCY_OBJECTIVE = Latency()
CAPACITY_OBJECTIVE = Capacity()
OBJECTIVES: dict[str, StudyObjective] = {o.mode: o for o in (LATENCY_OBJECTIVE, CAPACITY_OBJECTIVE)}
assert tuple(OBJECTIVES) == OBJECTIVE_MODES


def _configurations(count: int) -> str:
    return "configuration" if count == 1 else "configurations"


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
    """The objective a trial was measured for, from what it recorded: a capacity trial keeps
    its capacity (or the gate it fell below)."""
    return CAPACITY_OBJECTIVE if TrialRecord.of(trial).measured_capacity else LATENCY_OBJECTIVE
