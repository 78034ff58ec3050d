"""A study's configurations and their measurements: each configuration is its first trial and
the confirm step's re-measurements of it (``tuner.study.trials.confirm``), ranked by the median.

One configuration measured twice differs by 10 to 20 % (the H100; more on a shared CPU), so what
a configuration carries is the median of its measurements, not its luckiest one: the winner is
chosen by it (``tuner.study.result.choice``), and a searched capacity trial is gated at it
(``tuner.study.trials.search``).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

import optuna
from optuna.trial import FrozenTrial

from tuner.study.setup.objective import StudyObjective, of_study
from tuner.study.store.record import TrialRecord
from tuner.study.trials import significance
from tuner.study.trials.layout_phase import of_kept_layout
from tuner.study.trials.picks import served


@dataclass(frozen=True)
class Group:
    """One configuration's measurements: its first trial and every re-measurement, ranked by
    the study's ``objective``."""

    first: FrozenTrial
    trials: tuple[FrozenTrial, ...]
    objective: StudyObjective
    # Re-measurements whose client fell behind: not in ``trials`` (nor the median), but they
    # were taken, so the confirmation counts them (``measured``).
    left_out: tuple[FrozenTrial, ...] = ()

    @property
    def measured(self) -> int:
        """How many times the configuration was measured, left-out re-measurements included."""
        return len(self.trials) + len(self.left_out)

    @property
    def number(self) -> int:
        return self.first.number

    @property
    def values(self) -> list[float]:
        return [float(t.value) for t in self.trials if t.value is not None]

    @property
    def median(self) -> float:
        return float(statistics.median(self.values))

    @property
    def feasible(self) -> bool:
        feasible = sum(1 for t in self.trials if TrialRecord.of(t).feasible)
        return feasible * 2 > len(self.trials)

    @property
    def best(self) -> float:
        return min(self.values, key=self.objective.rank)

    @property
    def worst(self) -> float:
        return max(self.values, key=self.objective.rank)

    @property
    def median_trial(self) -> FrozenTrial:
        """The measurement at the median (of an even count, the worse middle one): a real one,
        among the measurements that share the configuration's verdict (of a feasible
        configuration its feasible ones, of an infeasible one its infeasible ones), so that the
        trial written says what the configuration does."""
        feasible = self.feasible
        trials = tuple(t for t in self.trials if TrialRecord.of(t).feasible == feasible)
        ordered = self.objective.best_first(trials)
        return ordered[len(ordered) // 2]

    def key(self) -> tuple[float, int]:
        """Sorts the best first: the median, then the earlier configuration."""
        return (self.objective.rank(self.median), self.number)

    def oriented(self) -> list[float]:
        """Its values, higher better whatever the direction, ``-inf`` for a measurement that
        missed the SLOs (``tuner.study.trials.significance``'s terms)."""
        return [
            -self.objective.rank(float(t.value)) if TrialRecord.of(t).feasible else -math.inf
            for t in self.trials
            if t.value is not None
        ]

    def beats(self, other: Group) -> bool:
        """Better than ``other`` beyond chance (``tuner.study.trials.significance.beats``): as
        many measurements of each, at least 3, each better than each of ``other``'s."""
        return significance.beats(self.oriented(), other.oriented())

    def in_every_measurement(self, other: Group) -> bool:
        """This one's worst measurement is better than ``other``'s best."""
        return significance.in_every_pair(self.oriented(), other.oriented())

    def pairs_won(self, other: Group) -> str:
        """``W of N pairs``: how many pairs of a measurement of each this one wins (a tie:
        half)."""
        won = significance.pairs_won(self.oriented(), other.oriented())
        return f"{won:g} of {len(self.values) * len(other.values)} pairs"

    def gain_over(self, other: Group) -> float:
        """How much better this median is than ``other``'s, as a fraction of ``other``'s
        (negative: worse); 0 where ``other``'s median is 0."""
        return self.objective.gain(self.median, other.median)


def groups(study: optuna.Study) -> list[Group]:
    """The served trials, grouped by configuration (a first trial and its re-measurements); of
    the study's kept layout only, where it keeps one."""
    objective = of_study(study)
    # Where the study keeps a layout, the configurations at it (its layout trials compared
    # layouts per GPU already: tuner.study.trials.layout_phase).
    trials = of_kept_layout(study, (t for t in study.get_trials(deepcopy=False) if served(t)))
    members: dict[int, list[FrozenTrial]] = {}
    left_out: dict[int, list[FrozenTrial]] = {}
    firsts: dict[int, FrozenTrial] = {}
    for trial in trials:
        recorded = TrialRecord.of(trial)
        origin = recorded.confirms
        if origin is not None:
            # A re-measurement whose client fell behind has figures of tuner's client, not of
            # the configuration: it is kept in the study, not in the median.
            held = left_out if recorded.client_behind else members
            held.setdefault(origin, []).append(trial)
        else:
            firsts[trial.number] = trial
            members.setdefault(trial.number, []).insert(0, trial)
    return [
        Group(first, tuple(members[n]), objective, tuple(left_out.get(n, ())))
        for n, first in firsts.items()
    ]


def ranked(study: optuna.Study) -> tuple[list[Group], Group | None, list[Group]]:
    """The feasible configurations, best median first, the baseline's group (if served) and the
    spec's candidates' groups (those served)."""
    return rank(groups(study))


def rank(all_groups: list[Group]) -> tuple[list[Group], Group | None, list[Group]]:
    """``ranked`` of a study's groups already read (``groups``)."""
    ranked = sorted((g for g in all_groups if g.feasible), key=Group.key)
    baseline = next((g for g in all_groups if TrialRecord.of(g.first).baseline), None)
    candidates = [g for g in all_groups if TrialRecord.of(g.first).candidate is not None]
    return ranked, baseline, candidates


def contender(study: optuna.Study) -> bool:
    """Whether a configuration besides vLLM's defaults met the SLOs: one the confirm step can
    hold against them."""
    return any(not TrialRecord.of(g.first).baseline for g in ranked(study)[0])


def any_confirms(study: optuna.Study) -> bool:
    """Whether the study holds any re-measurement."""
    return any(TrialRecord.of(t).confirms is not None for t in study.get_trials(deepcopy=False))
