"""A run's time budget, shared between the search and the confirm step.

A run that searches until its time is up leaves nothing for the confirmation, and then cannot
say whether its winner beats vLLM's defaults or was lucky once. So the budget is planned: the
confirmation's fresh measurements (the finalist and the baseline, ``confirm_repeats`` each) are
held back from the start, and the search stops as soon
as one more trial and the confirmation together would end after the budget.

What a trial costs is estimated before any ran (``Budget.estimate_s``: an engine start and the
measurement the spec asks for) and then taken from the trials measured: the longest so far, so
that a slow one does not push the confirmation out of the budget, but the run's first left out
once a later one is measured. The first fills vLLM's compile cache and, in a new study, starts
its capacity search from the window's rate; the later ones start from a capacity measured
before. In 11 of the 12 GPU studies kept it was the longest searched trial (the 12th's second
trial was a candidate, on a compile key of its own), and planning the rest from it stopped the
search early: the H200 conversation study of 2026-11-28 ran 3 of 20 trials and ended 300 s
inside its budget.

Until a configuration besides vLLM's defaults has met the SLOs (``contender``), the confirm step
has nothing to confirm, and a run that stops searching there answers only "keep the defaults,
nothing else was measured". So until there is one, a searched trial need leave room only for
the confirmation's first turn (the new leader and the defaults once more each); the rest of the
confirmation is measured as far as the budget then allows. On the Mooncake trace (H200,
2026-11-28) a 1200 s run stopped after the defaults' 249 s trial, 908 s left: one more trial
and four re-measurements were planned at 249 + 4 x 174 s. Continued, the next trial took 218 s
and the four re-measurements 126 to 147 s (778 s in all), and it beat the defaults by 1.46x in
every measurement.

A confirming measurement repeats a configuration already measured. It is planned at the longest
measured once one is; before, at the longest searched trial after the first (in those 12
studies the longest confirming measurement took 0.60 to 0.82 of that), or, with only the first
measured, at ``confirm_share`` of it (``GPU_CONFIRM_SHARE`` on a GPU). Where the confirmation is
the run's only work (``tuner run --confirm-only``, which ``--gpus`` runs once its workers end),
its first measurement is the run's first trial and carries the run's one-off costs, the
launcher's start and the process's first engine start; it is left out, as the first searched
trial is, once a later one is measured. In the three such confirmations kept (H200, 2026-12-03
and 2026-12-04) the first took 113, 122 and 126 s and the later ones 76 to 94 s: planned at
126 s, the last of 2026-12-04's six did not fit the 121 s left, and the defaults were kept for
want of one measurement. In the five kept that followed a search in the same run, the first
was the longest in two and 2 to 16 s under it in three: those keep every measurement in the
plan.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from optuna.trial import FrozenTrial

from tuner.study.measure.trial import WINDOW_S
from tuner.study.store.record import TrialRecord

# An engine start before any was measured in the run: vLLM's OpenAI server on an H100 took 45 to
# 145 s to a healthy /health, its CPU build 40 to 90 s on two cores.
ENGINE_START_GUESS_S = 90.0
# A confirming measurement's cost as a share of the longest searched trial's, on a GPU: its
# compile is cached and its rates start at the capacity measured (benchmarks/confirm_share.py
# measures it); 1 on vLLM's CPU build.
GPU_CONFIRM_SHARE = 0.7
# The windows a later trial's measurement is planned at, while only the run's first is
# measured: a capacity search from a capacity measured resolves one within two resolutions of
# it in 3 (``tuner.study.capacity.rates``).
LATER_WINDOWS = 3


@dataclass(frozen=True)
class Parts:
    """Where a trial's seconds went: ``measure_s`` of them measuring, over ``windows`` windows
    (a capacity search's rates; a latency trial's one replay), the rest its engine's start,
    warm-up and stop."""

    measure_s: float
    windows: int

    @classmethod
    def of(cls, trial: FrozenTrial) -> Parts | None:
        """A finished trial's parts, from its record (``window_s``, the rates it measured);
        None where it measured nothing (its engine failed to start)."""
        record = TrialRecord.of(trial)
        measure_s = record.timings_s.get(WINDOW_S)
        if measure_s is None:
            return None
        return cls(measure_s, max(record.rates_measured, 1))

    def priced_s(self, total_s: float, windows: int) -> float:
        """``total_s``, the trial's seconds, had it measured at most ``windows`` windows at
        its own seconds a window."""
        if self.windows <= windows:
            return total_s
        return total_s - self.measure_s * (1.0 - windows / self.windows)


@dataclass
class Budget:
    """The run's end (``ends``, ``clock()`` seconds), the trials the confirm step holds back
    (``confirm_trials``), and the cost of a trial: ``estimate_s`` until one is measured; a
    confirming measurement's, ``confirm_share`` of that until one is measured."""

    ends: float
    confirm_trials: int
    estimate_s: float
    clock: Callable[[], float] = time.monotonic
    # What the searched trials and the confirming measurements took, each in the order run.
    costs: list[float] = field(default_factory=list)
    confirm_costs: list[float] = field(default_factory=list)
    confirm_share: float = 1.0
    # Whether the study holds a configuration besides vLLM's defaults that met the SLOs, one the
    # confirm step can hold against them; until it does, the next searched trial need leave room
    # only for the confirmation's first turn (``held_s``).
    contender: bool = True
    # The spec's candidates the confirmation measures again (``confirm_candidates``), each
    # ``repeats`` more times: counted in ``confirm_trials``, named in ``plan`` and ``eta``.
    candidates: int = 0
    # Where the run's first searched trial's seconds went, where told (``spent``).
    first_parts: Parts | None = None

    def spent(self, seconds: float, confirming: bool = False, parts: Parts | None = None) -> None:
        """A searched trial, or a confirming measurement, took ``seconds``; where the run's
        first searched trial's went (``parts``) prices the next until a later one is measured."""
        if not confirming and not self.costs:
            self.first_parts = parts
        (self.confirm_costs if confirming else self.costs).append(seconds)

    @property
    def trial_s(self) -> float:
        """What the next searched trial is planned to cost: the longest measured after the run's
        first; else the first, its measurement priced at ``LATER_WINDOWS`` windows where its
        parts were told; else the estimate."""
        if len(self.costs) == 1 and self.first_parts is not None:
            return self.first_parts.priced_s(self.costs[0], LATER_WINDOWS)
        return _longest_after_first(self.costs) if self.costs else self.estimate_s

    @property
    def confirm_s(self) -> float:
        """What the next confirming measurement is planned to cost: the longest measured (after
        the first, where the first was the run's first trial and a later one is measured), else
        the longest searched trial after the first, else ``confirm_share`` of the first (or of
        the estimate)."""
        if self.confirm_costs:
            if self.costs:  # the run's first trial was a searched one
                return max(self.confirm_costs)
            return _longest_after_first(self.confirm_costs)
        if len(self.costs) > 1:
            return self.trial_s
        return self.confirm_share * self.trial_s

    @property
    def left_s(self) -> float:
        return self.ends - self.clock()

    @property
    def whole_s(self) -> float:
        """What the whole confirmation is planned to take."""
        return self.confirm_s * self.confirm_trials

    @property
    def first_turn_s(self) -> float:
        """What the confirmation's first turn (the leader and the defaults once more each) is
        planned to take."""
        return self.confirm_s * min(self.confirm_trials, 2)

    @property
    def held_s(self) -> float:
        """What the next searched trial must leave for the confirmation: all of it once there is
        a contender; before, its first turn."""
        return self.whole_s if self.contender else self.first_turn_s

    def may_search(self) -> bool:
        """Whether one more searched trial and the confirmation it must leave room for
        (``held_s``) end within the budget."""
        return self.trial_s + self.held_s <= self.left_s

    def may_confirm(self) -> bool:
        """Whether one more confirming measurement ends within the budget."""
        return self.confirm_s <= self.left_s

    def searched_trials(self) -> int:
        """How many more searched trials the budget buys, the confirmation held back: at least
        one where the first contender may still be searched for (``may_search``)."""
        whole = math.floor((self.left_s - self.whole_s) / self.trial_s)
        return max(whole, int(not self.contender and self.may_search()), 0)

    def confirm_fits(self) -> bool:
        """Whether the budget left holds the confirmation's first turn at least."""
        return self.first_turn_s <= self.left_s

    def plan(self, n_trials: int, repeats: int, ran: int = 0) -> str:
        """What the budget buys, in words: ``about N of the M trials, then the finalist and the
        baseline, K fresh measurements each (about T s a trial, estimated)``, or, where the
        trials it buys leave room for only part of the confirmation, how many of its fresh
        measurements fit. After ``ran`` of the ``n_trials`` trials, of those left."""
        cost = self._trial_words()
        if self.confirm_trials and self.confirm_s != self.trial_s:
            cost += f"; {self.confirm_s:.0f} s a re-measurement"
        trials = min(n_trials - ran, self.searched_trials())
        left = n_trials - ran
        of = f"of the {n_trials} trials"
        if ran:
            of = f"more of the {left} trial{'s' if left != 1 else ''} left"
        if not self.confirm_trials:
            return f"the budget buys about {trials} {of} ({cost})"
        if not self.confirm_fits():
            return (
                f"the budget ({self.left_s:.0f} s left) is too small for the confirmation "
                f"({self.confirm_trials} measurements of {cost}): the baseline will be kept "
                "unless it misses the SLOs (no verdict without fresh measurements); give a larger "
                "--time-budget-s"
            )
        fresh = f"{repeats} fresh measurement{'s' if repeats != 1 else ''} each"
        fresh += self._also(repeats)
        left_s = self.left_s - trials * self.trial_s
        if left_s < self.whole_s:
            fits = min(math.floor(left_s / self.confirm_s), self.confirm_trials)
            return (
                f"the budget buys about {trials} {of}, then as much of the confirmation as the "
                f"time left holds, about {fits} of its {self.confirm_trials} fresh measurements "
                f"(the finalist and the baseline, {fresh} asked for; short of them the baseline "
                f"is kept) ({cost}); a larger --time-budget-s confirms in full"
            )
        return (
            f"the budget buys about {trials} {of}, then the finalist and the baseline, "
            f"{fresh}, fewer where a pair favours the baseline ({cost})"
        )

    def _also(self, repeats: int) -> str:
        """``, and your 2 candidates 3 more times each``, where the confirmation measures the
        spec's candidates again; else nothing."""
        if not self.candidates:
            return ""
        many = "s" if self.candidates != 1 else ""
        return (
            f", and the {self.candidates} candidate{many} {repeats} more "
            f"time{'s' if repeats != 1 else ''}{' each' if many else ''}"
        )

    def _trial_words(self) -> str:
        """``about T s a trial, measured`` (or ``estimated``, before any trial ended)."""
        return f"about {self.trial_s:.0f} s a trial, {'measured' if self.costs else 'estimated'}"

    def eta(self, n_trials: int, repeats: int) -> str:
        """Without a budget, what the run will take, in words: ``n_trials`` more trials and the
        whole confirmation, at the costs planned (``trial_s``, ``confirm_s``)."""
        total_s = n_trials * self.trial_s + self.whole_s
        cost = self._trial_words()
        then = ""
        if self.confirm_trials:
            cost += f"; {self.confirm_s:.0f} s a re-measurement"
            then = (
                f" and the confirmation (the finalist and the baseline, up to {repeats} fresh "
                f"measurements each{self._also(repeats)})"
            )
        took = f"{total_s / 3600:.1f} h" if total_s >= 5400 else f"{total_s / 60:.0f} min"
        verb = "takes" if n_trials == 1 and not then else "take"
        return (
            f"no time budget: {n_trials} more trial{'s' if n_trials != 1 else ''}{then} {verb} "
            f"about {took} ({cost}); --time-budget-s SECONDS ends the search in time to confirm"
        )


def confirm_trials(top_k: int, repeats: int, candidates: int = 0) -> int:
    """The measurements the confirmation takes at most: the finalist and the baseline on
    ``repeats`` fresh engines each, and the ``candidates`` ``repeats`` more times each; none
    where ``top_k`` or ``repeats`` is 0 (the spec turns the confirmation off)."""
    if top_k <= 0 or repeats <= 0:
        return 0
    return repeats * (2 + candidates)


def _longest_after_first(costs: list[float]) -> float:
    """The longest of ``costs`` after the first, the run's first trial (it carries the run's
    one-off costs); the first while it is the only one."""
    return max(costs[1:]) if len(costs) > 1 else costs[0]
