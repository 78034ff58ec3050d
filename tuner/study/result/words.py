"""What ``tuner run`` and the YAML header say of a study's value, by its objective: one
``ValueWords`` per ``objective_mode`` in ``WORDS`` (the objective itself holds no words,
``tuner.study.setup.objective``), asked through ``words_of``.

- ``ValueWords``: a latency study's score, and what to try where nothing met the SLOs.
- ``RateWords``: a capacity study's rate, as a multiple of the trace's peak and the servers that
  peak needs (``tuner.study.capacity.text``), and vLLM's defaults at the leading
  configuration's capacity.
- ``GoodputWords``: a goodput study's rate, said as capacity is, under its own name.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from optuna.trial import FrozenTrial

from tuner.study.capacity.text import (
    capacity_of,
    compared_line,
    headline,
    num,
    servers_line,
    table_rows,
)
from tuner.study.measure.judge import GOODPUT_SHARE
from tuner.study.measure.next_steps import Offered, next_steps
from tuner.study.measure.scoring import Miss
from tuner.study.plan.layouts import Layout, layout_of, per_gpu
from tuner.study.setup.objective import (
    CAPACITY_OBJECTIVE,
    GOODPUT_OBJECTIVE,
    LATENCY_OBJECTIVE,
    OBJECTIVES,
    StudyObjective,
)
from tuner.study.store.record import VLLM_DEFAULTS, TrialRecord

# The end table's rows of a study's value (name, the chosen trial's, the other's), and its
# lines: what the result says besides the latency figures.
Rows = list[tuple[str, str, str]]


class ValueWords:
    """A latency study's words: a score, the lower the better. ``name`` and ``unit`` say a
    value (``winner trial 7: score median 0.612``)."""

    name = "score"
    unit = ""

    def text(self, value: float) -> str:
        """A trial's value as tables and verdicts show it."""
        return f"{value:.3f}"

    def trial_words(self, trial: FrozenTrial) -> str | None:
        """The trial's value as ``tuner run``'s trial line says it."""
        return None if trial.value is None else f"score {trial.value:.3f}"

    def result_lines(
        self,
        chosen: FrozenTrial,
        other: Mapping[str, Any] | None,
        peak_req_per_s: float | None,
        other_label: str = "defaults",
        other_layout: Layout | None = None,
    ) -> tuple[Rows, list[str], str]:
        """What the result says besides the latency figures: rows of the end table (name, the
        chosen trial's, the other's: the defaults', or where they are kept the closest searched
        configuration's; ``other_layout``: the other's layout, by default the chosen's),
        headline lines, and where the figures were measured."""
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


class RateWords(ValueWords):
    """A capacity study's words: the highest rate one server carries, in req/s."""

    name = "capacity"
    unit = " req/s"
    # What the search lets a window relax, besides the SLOs, where nothing met them.
    relax = "or lengthen capacity_probe_s"

    def text(self, value: float) -> str:
        return f"{num(value)} req/s"

    def trial_words(self, trial: FrozenTrial) -> str | None:
        recorded = TrialRecord.of(trial)
        if recorded.capacity_req_per_s is not None:
            rates, capacity = recorded.rates_measured, recorded.capacity_req_per_s
            layout = layout_of(recorded.engine_args)
            each = "" if layout.gpus == 1 else f", {num(per_gpu(capacity, layout))} per GPU"
            return f"{self.name} {num(capacity)} req/s{each} ({rates} rates measured)"
        if recorded.below_req_per_s is not None:
            return f"{self.name} below {num(recorded.below_req_per_s)} req/s"
        return super().trial_words(trial)

    def headline(
        self,
        chosen: FrozenTrial,
        other: Mapping[str, Any] | None,
        peak: float | None,
        other_label: str,
    ) -> str:
        """The value's line: ``capacity: X req/s (Yx the trace's peak rate; defaults Z req/s)``."""
        return headline(TrialRecord.of(chosen).figures, other, peak, other_label, self.name)

    def result_lines(
        self,
        chosen: FrozenTrial,
        other: Mapping[str, Any] | None,
        peak_req_per_s: float | None,
        other_label: str = "defaults",
        other_layout: Layout | None = None,
    ) -> tuple[Rows, list[str], str]:
        recorded = TrialRecord.of(chosen)
        figures, layout = recorded.figures, layout_of(recorded.engine_args)
        found = capacity_of(figures) or 0.0
        lines = [
            self.headline(chosen, other, peak_req_per_s, other_label),
            servers_line(found, peak_req_per_s, f"trial {chosen.number}", layout),
        ]
        layouts = (layout, layout if other_layout is None else other_layout)
        rows = table_rows(figures, other, peak_req_per_s, self.name, layouts)
        mine = f"{num(found)} req/s" if found else "the lowest rate it tried"
        where = f"each at its own {self.name} (this configuration at {mine}"
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
            f"the SLOs in {spec_path} ({self.relax}) and search again under a new --study"
        ]


class GoodputWords(RateWords):
    """A goodput study's words: the highest rate at which enough of the requests meet every
    SLO, said as capacity is, with the share it was held to."""

    name = "goodput"
    relax = "lower goodput_share, or lengthen capacity_probe_s"

    def headline(
        self,
        chosen: FrozenTrial,
        other: Mapping[str, Any] | None,
        peak: float | None,
        other_label: str,
    ) -> str:
        line = super().headline(chosen, other, peak, other_label)
        share = TrialRecord.of(chosen).figure(GOODPUT_SHARE)
        if share is None:
            return line
        return f"{line}; the highest rate with {share:.0%} of requests within every SLO"


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


WORDS: dict[str, ValueWords] = {
    LATENCY_OBJECTIVE.mode: ValueWords(),
    CAPACITY_OBJECTIVE.mode: RateWords(),
    GOODPUT_OBJECTIVE.mode: GoodputWords(),
}
assert set(WORDS) == set(OBJECTIVES)


def words_of(objective: StudyObjective) -> ValueWords:
    """What ``tuner run`` and the YAML header say of ``objective``'s value."""
    return WORDS[objective.mode]
