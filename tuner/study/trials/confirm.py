"""The confirmation: the search's finalist against the baseline, on fresh engines, in turns.

The search's measurements choose; they never confirm. A finalist picked as the best of several
first measurements is partly the luckiest, and a test that counted that measurement would favour
it (the winner's curse: in the GPU studies kept, a re-measured leader's first measurement was the
best of its group 17.5 times in 27 and 11 % above its re-measurements). So:

- **One finalist**: the best feasible searched configuration by the median of its search
  measurements (``finalist``; fresh ones never rank it), or none where no searched
  configuration met the SLOs.
- **Fresh pairs, in ABBA order**: the finalist and the baseline, each measured ``repeats`` more
  times on fresh engines (finalist, baseline, baseline, finalist, finalist, baseline...), so that
  a slow stretch of the machine falls on both alike. Each is a trial of its own, with the
  parameters of the configuration it repeats and the user attributes ``confirms`` (the trial it
  repeats) and ``fresh_for`` (the finalist's number), so the dashboard shows it.
- **Stopped at the first pair that favours the baseline**: the finalist is written only where
  each of its fresh measurements beats each of the baseline's, as many of each
  (``tuner.study.trials.significance.beats``: at 3 against 3, p = 1/20). One fresh pair the other
  way decides against it, and nothing more is measured (about 3 measurements, not 6, where the
  finalist is no better).
- **On one device**: each fresh measurement records its host and GPUs
  (``tuner.study.store.record.Placement``); a round's pairs are those measured on the host and
  GPUs of its first fresh measurement, and one measured elsewhere is set aside (counted toward
  ``Round.limit``, never compared), since two GPUs of one model differ by more than some gains.
  A worker on another device does not continue the round (``elsewhere``).
- **At one rate**: each fresh measurement of the baseline in a capacity study also replays one
  window at the finalist's capacity in the search, where that is above its own; where the
  baseline met the SLOs at the finalist's confirmed capacity, the finalist is not written
  (``Round.defaults_meet``).

**One round per study**, its finalist frozen when it starts (``started``: the configuration
its first fresh measurement was queued for). A study continued with more trials, or whose spec's
candidates are re-measured after the round, finishes that round and opens no other, whatever
the search ranks first since: each round that could write is a test at up to 1/20, so a study
that opened one per continuation would write a configuration no better than the baseline more
often the longer it ran (``benchmarks/aa_paths.py`` measures it, continued up to 12 times). Spending
the 1/20 across rounds instead (the k-th at 1/20 times a share summing to 1) would bound that
too, but every round then tests below 1/20, and at three fresh measurements each none can:
the first round, the only one most studies have, would need four of each (1/70) to pay for
continuations most studies never make. So the first round is the study's only one, at the full
1/20; a search that moved on is confirmed in a new study. Fresh measurements whose client fell
behind say nothing of the server: they are taken again, within ``Round.limit`` measurements.
What is written is then ``tuner.study.result.choice``'s.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial

import optuna
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.trial import FrozenTrial

from tuner.study.store.record import Placement, Queued, TrialRecord
from tuner.study.trials import significance
from tuner.study.trials.budget import Budget
from tuner.study.trials.groups import Group, groups, rank
from tuner.study.trials.picks import served
from tuner.study.trials.search import Measuring, measure

logger = logging.getLogger(__name__)

FINALIST = "finalist"
BASELINE = "baseline"
# The order of the fresh measurements, repeated: A B B A.
ORDER = (FINALIST, BASELINE, BASELINE, FINALIST)
# Fresh measurements taken, at most, per measurement a round asks for (client-behind ones are
# taken again, up to this).
RETAKES = 1.5


def searched_only(group: Group) -> Group:
    """``group`` with only the measurements that choose: none of a confirmation's."""
    kept = tuple(t for t in group.trials if TrialRecord.of(t).fresh is None)
    return Group(group.first, kept or group.trials[:1], group.objective)


def finalist(all_groups: Sequence[Group]) -> Group | None:
    """The best feasible searched configuration by the median of its search measurements (not
    vLLM's defaults nor any fresh measurement); None where no searched one met the SLOs."""
    chosen = [searched_only(g) for g in all_groups]
    feasible, baseline, _ = rank(chosen)
    searched = [g for g in feasible if baseline is None or g.number != baseline.number]
    if not searched:
        return None
    return next(g for g in all_groups if g.number == searched[0].number)


@dataclass(frozen=True)
class Round:
    """One confirmation: the ``finalist``'s and the ``baseline``'s groups, their fresh
    measurements for it (client-behind ones apart), and how many each is to get."""

    finalist: Group
    baseline: Group
    repeats: int
    # Fresh measurements that served nothing (an engine that failed to start, a window
    # interrupted): taken, so they count toward ``limit``, but they hold no value; those of the
    # finalist (their trial numbers) decide against it, as a pair in the baseline's favour.
    dropped: int = 0
    failed: tuple[int, ...] = ()
    # Where its pairs are measured: the host and GPUs of its first fresh measurement (None
    # before it, or where that recorded none); fresh measurements elsewhere, set aside.
    device: Placement | None = None

    def here(self, trial: FrozenTrial) -> bool:
        """Whether ``trial`` was measured on the round's device (or either recorded none)."""
        placement = TrialRecord.of(trial).placement
        if self.device is None or placement is None:
            return True
        return placement.device == self.device.device

    def _fresh(self, group: Group) -> tuple[FrozenTrial, ...]:
        number = self.finalist.number
        return tuple(
            t
            for t in group.trials
            if TrialRecord.of(t).fresh == number and t is not group.first and self.here(t)
        )

    def _behind(self, group: Group) -> int:
        number = self.finalist.number
        return sum(1 for t in group.left_out if TrialRecord.of(t).fresh == number)

    def _elsewhere(self, group: Group) -> int:
        number = self.finalist.number
        return sum(
            1 for t in group.trials if TrialRecord.of(t).fresh == number and not self.here(t)
        )

    @property
    def finalist_fresh(self) -> Group:
        """The finalist's fresh measurements, as a group of their own (the first trial the
        finalist's, for its arguments)."""
        return Group(self.finalist.first, self._fresh(self.finalist), self.finalist.objective)

    @property
    def baseline_fresh(self) -> Group:
        """The baseline's fresh measurements, as a group of their own."""
        return Group(self.baseline.first, self._fresh(self.baseline), self.baseline.objective)

    @property
    def taken(self) -> int:
        """Fresh measurements taken, client-behind ones included."""
        mine, theirs = self.finalist_fresh.trials, self.baseline_fresh.trials
        behind = self._behind(self.finalist) + self._behind(self.baseline)
        elsewhere = self._elsewhere(self.finalist) + self._elsewhere(self.baseline)
        return len(mine) + len(theirs) + behind + elsewhere + self.dropped

    def after(self, trial: FrozenTrial) -> Round:
        """The round once ``trial``, a fresh measurement of it just taken, is added: to the
        finalist's or the baseline's measurements (those whose client fell behind apart), or
        counted as dropped where it served nothing."""
        recorded = TrialRecord.of(trial)
        if self.device is None and recorded.placement is not None:
            return replace(self, device=recorded.placement).after(trial)
        if not served(trial):
            mine = recorded.confirms == self.finalist.number and self.here(trial)
            failed = (*self.failed, trial.number) if mine else self.failed
            return replace(self, dropped=self.dropped + 1, failed=failed)
        group = self.finalist if recorded.confirms == self.finalist.number else self.baseline
        if recorded.client_behind:
            group = replace(group, left_out=(*group.left_out, trial))
        else:
            group = replace(group, trials=(*group.trials, trial))
        if group.number == self.finalist.number:
            return replace(self, finalist=group)
        return replace(self, baseline=group)

    @property
    def limit(self) -> int:
        return math.ceil(2 * self.repeats * RETAKES)

    @property
    def against(self) -> tuple[FrozenTrial, FrozenTrial] | None:
        """The first fresh pair (the finalist's measurement, the baseline's) in which the
        finalist is not better; None where every pair so far favours it."""
        mine, theirs = self.finalist_fresh, self.baseline_fresh
        for t, a in zip(mine.trials, mine.oriented(), strict=True):
            for o, b in zip(theirs.trials, theirs.oriented(), strict=True):
                if not a > b:
                    return t, o
        return None

    @property
    def complete(self) -> bool:
        """Whether both have their ``repeats`` fresh measurements."""
        mine, theirs = self.finalist_fresh.trials, self.baseline_fresh.trials
        return len(mine) >= self.repeats and len(theirs) >= self.repeats

    def next_arm(self) -> str | None:
        """Which to measure next (``FINALIST`` or ``BASELINE``), by ABBA order of the fresh
        measurements kept; None once decided, complete, or out of retakes."""
        if self.failed or self.against is not None:
            return None
        if self.complete or self.taken >= self.limit:
            return None
        mine, theirs = len(self.finalist_fresh.trials), len(self.baseline_fresh.trials)
        arm = ORDER[(mine + theirs) % len(ORDER)]
        if arm == FINALIST and mine >= self.repeats:
            return BASELINE
        if arm == BASELINE and theirs >= self.repeats:
            return FINALIST
        return arm

    @property
    def confirmed(self) -> bool:
        """Whether the finalist beats the baseline beyond chance on fresh engines, and the
        baseline did not meet the SLOs at the finalist's confirmed capacity."""
        if self.failed:
            return False
        mine, theirs = self.finalist_fresh.oriented(), self.baseline_fresh.oriented()
        return significance.beats(mine, theirs) and not self.defaults_meet()

    def p_value(self) -> float:
        return significance.p_value(self.finalist_fresh.oriented(), self.baseline_fresh.oriented())

    def defaults_meet(self) -> list[FrozenTrial]:
        """The baseline's fresh measurements that met the SLOs at the finalist's median fresh
        value or above (a capacity study: its capacity, or its one window at the finalist's
        capacity); none in a latency study, which measures every configuration at one load."""
        mine = self.finalist_fresh
        if not mine.values or not mine.objective.searches_rates:
            return []
        rate = mine.median
        met = []
        for trial in self.baseline_fresh.trials:
            recorded = TrialRecord.of(trial)
            compared = recorded.compared or {}
            at = float(compared.get("rate_req_per_s") or 0.0)
            if (recorded.capacity_req_per_s or 0.0) >= rate or (
                compared.get("passed") and at >= rate
            ):
                met.append(trial)
        return met


def current(study: optuna.Study, repeats: int) -> Round | None:
    """The study's confirmation round: its finalist against the baseline; None where there is
    no finalist or the baseline did not serve. A study holds one round: once its first fresh
    measurement is queued, the round's finalist is that measurement's (``started``)."""
    trials = study.get_trials(deepcopy=False)
    state = round_of(groups(study), repeats, started(trials))
    if state is None:
        return None
    number = state.finalist.number
    state_of = state
    for trial in trials:
        recorded = TrialRecord.of(trial)
        if recorded.fresh == number and trial.state.is_finished() and not served(trial):
            state_of = state_of.after(trial)
    return state_of


def started(trials: Sequence[FrozenTrial]) -> int | None:
    """The finalist of the study's round, frozen when the round started: the configuration
    the study's first fresh measurement was queued for (whatever became of it); None before
    any was. What the search or a re-measured candidate measures afterwards does not move it."""
    fresh = [t for t in trials if TrialRecord.of(t).fresh is not None]
    if not fresh:
        return None
    return TrialRecord.of(min(fresh, key=lambda t: t.number)).fresh


def round_of(all_groups: Sequence[Group], repeats: int, frozen: int | None = None) -> Round | None:
    """The round of a study's groups already read (its dropped measurements not counted): of
    configuration ``frozen`` where the round has started (``started``; None where that one is
    not among ``all_groups``), else of the search's ``finalist``."""
    if frozen is None:
        chosen = finalist(all_groups)
    else:
        chosen = next((g for g in all_groups if g.number == frozen), None)
    baseline = rank(list(all_groups))[1]
    if chosen is None or baseline is None:
        return None
    fresh = sorted(
        (t for g in (chosen, baseline) for t in (*g.trials, *g.left_out)
         if TrialRecord.of(t).fresh == chosen.number),
        key=lambda t: t.number,
    )  # fmt: skip
    placed = (TrialRecord.of(t).placement for t in fresh)
    device = next((p for p in placed if p is not None), None)
    return Round(chosen, baseline, repeats, device=device)


def elsewhere(state: Round, placement: Placement) -> str | None:
    """Why a worker at ``placement`` does not continue ``state``'s round: its pairs are
    measured on another device; None where it may."""
    device = state.device
    if device is None or device.device == placement.device or state.next_arm() is None:
        return None
    return (
        f"not confirming here ({placement}): the confirmation of trial {state.finalist.number} "
        f"is measured on {device}, each pair on one device; run tuner run --confirm-only there"
    )


OnTrial = Callable[[FrozenTrial], None]


def confirm(
    study: optuna.Study,
    how: Measuring,
    repeats: int,
    on_trial: OnTrial | None = None,
    budget: Budget | None = None,
) -> int:
    """Measure the round's finalist and baseline on fresh engines in ABBA order until it is
    decided (a pair against the finalist), complete (``repeats`` each) or the ``budget`` holds
    no more; how many trials ran. The round is read from the study once; each fresh
    measurement is then added to it as it ends (``Round.after``)."""
    ran = 0
    state = current(study, repeats)
    while state is not None and (arm := state.next_arm()) is not None:
        if budget is not None and not budget.may_confirm():
            logger.info("time budget reached while confirming, after %d trials", ran)
            break
        group = state.finalist if arm == FINALIST else state.baseline
        compare = _capacity_of(state.finalist) if arm == BASELINE else None
        take = partial(measure_again, study, group.first, how, state.finalist.number, compare)
        frozen = _taken(budget, on_trial, take)
        ran += 1
        state = state.after(frozen)
    return ran


def again(
    study: optuna.Study,
    number: int,
    how: Measuring,
    times: int,
    on_trial: OnTrial | None = None,
    budget: Budget | None = None,
) -> int:
    """Measure configuration ``number`` until it has ``times`` measurements (a configuration
    alone served, whose median is then written; a candidate held against the answer)."""
    ran = 0
    while True:
        group = next((g for g in groups(study) if g.number == number), None)
        if group is None or group.measured >= times or ran >= times:
            return ran
        if budget is not None and not budget.may_confirm():
            return ran
        _taken(budget, on_trial, partial(measure_again, study, group.first, how))
        ran += 1


def _taken(
    budget: Budget | None, on_trial: OnTrial | None, take: Callable[[], FrozenTrial]
) -> FrozenTrial:
    """One confirming measurement (``take``), its seconds spent from the ``budget`` and the
    trial told to ``on_trial``."""
    began = time.monotonic()
    frozen = take()
    if budget is not None:
        budget.spent(time.monotonic() - began, confirming=True)
    if on_trial is not None:
        on_trial(frozen)
    return frozen


def _capacity_of(group: Group) -> float | None:
    """The finalist's median in the search, where its study measures capacities."""
    if not group.objective.searches_rates:
        return None
    median = searched_only(group).median
    return median if median > 0 else None


def measure_again(
    study: optuna.Study,
    first: FrozenTrial,
    how: Measuring,
    fresh: int | None = None,
    at: float | None = None,
) -> FrozenTrial:
    """One more measurement of ``first``'s configuration, as a trial of its own (``fresh``: of
    the confirmation of that finalist; ``at``: a rate to replay once more where above its
    capacity)."""
    queued = Queued(confirms=first.number, fresh=fresh)
    study.enqueue_trial(dict(first.params), user_attrs=queued.attrs())
    trial = study.ask()
    for name, distribution in first.distributions.items():
        _suggest_again(trial, name, distribution)
    recorded = TrialRecord.of(first)
    return measure(study, trial, recorded.engine_args, how, prunable=False, compare_at=at)


def _suggest_again(trial: optuna.Trial, name: str, distribution: BaseDistribution) -> None:
    """Suggest ``name`` over ``distribution``: the enqueued value comes back, and the trial
    holds it as a parameter like the first measurement did."""
    if isinstance(distribution, IntDistribution):
        d = distribution
        trial.suggest_int(name, d.low, d.high, step=d.step, log=d.log)
    elif isinstance(distribution, FloatDistribution):
        f = distribution
        trial.suggest_float(name, f.low, f.high, step=f.step, log=f.log)
    elif isinstance(distribution, CategoricalDistribution):
        trial.suggest_categorical(name, distribution.choices)
