"""The run's time budget: the confirmation is held back from the start, and the search stops
where one more trial would leave too little for it. A scripted clock, no engine."""

from __future__ import annotations

import dataclasses
import math

import optuna
import pytest

from tuner.study.measure.trial import WINDOW_S
from tuner.study.store.record import CAPACITY_ATTR, RATES_ATTR, TIME_PREFIX
from tuner.study.trials.budget import (
    GPU_CONFIRM_SHARE,
    LATER_WINDOWS,
    Budget,
    Parts,
    confirm_trials,
)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def gpu_budget(
    ends: float, clock: Clock, estimate_s: float = 140.0, contender: bool = True
) -> Budget:
    """A GPU run's budget with four fresh measurements held back (the finalist and the baseline
    twice each), a fresh measurement planned at ``GPU_CONFIRM_SHARE`` until one is measured."""
    return Budget(
        ends=ends,
        confirm_trials=4,
        estimate_s=estimate_s,
        clock=clock,
        confirm_share=GPU_CONFIRM_SHARE,
        contender=contender,
    )


def test_the_confirmation_is_held_back_from_the_search() -> None:
    clock = Clock()
    budget = Budget(ends=1000.0, confirm_trials=4, estimate_s=100.0, clock=clock)
    # 1000 s buy ten trials of 100 s: four are the confirmation's, six the search's.
    assert budget.searched_trials() == 6
    said = budget.plan(20, 2)
    assert "about 6 of the 20 trials, then the finalist and the baseline, 2 fresh measurements" in (
        said
    )
    assert "each, fewer where a pair favours the baseline" in said
    assert "estimated" in budget.plan(20, 2)
    clock.now = 500.0  # five trials run: one more and four to confirm end at exactly 1000
    assert budget.may_search()
    clock.now = 500.1
    assert not budget.may_search() and budget.may_confirm()
    clock.now = 900.1
    assert not budget.may_confirm()


def test_the_longest_trial_measured_plans_the_rest() -> None:
    clock = Clock()
    budget = Budget(ends=1000.0, confirm_trials=2, estimate_s=50.0, clock=clock)
    budget.spent(120.0)  # the first trial took longer than the estimate
    clock.now = 120.0
    assert budget.trial_s == 120.0 and budget.confirm_s == 120.0
    assert budget.searched_trials() == 5  # 880 s: seven trials of 120 s, two of them confirming
    assert "measured" in budget.plan(10, 1)
    budget.spent(80.0)
    budget.spent(95.0)
    clock.now = 295.0
    assert budget.trial_s == 95.0  # the longest after the first
    budget.spent(130.0)  # a later trial as slow as the first counts in full
    assert budget.trial_s == 130.0 and budget.confirm_s == 130.0


def test_the_first_trial_plans_the_rest_only_until_a_later_one_is_measured() -> None:
    """The H200 conversation study of benchmarks/results/h200-conv-user/: trial 0 took 208 s
    (a cold compile, six rates), trials 1 and 2 121 and 105 s, and about 790 s were left with
    four re-measurements held back (they took 89 to 105 s). Planned from trial 0 the search
    stopped there (208 + 4 x 146 > 790); planned from the later trials it runs about two more."""
    clock = Clock()
    budget = gpu_budget(1250.0, clock)
    budget.spent(208.0)
    assert budget.trial_s == 208.0 and budget.confirm_s == pytest.approx(0.7 * 208.0)
    budget.spent(121.0)
    budget.spent(105.0)
    clock.now = 1250.0 - 790.0
    assert budget.trial_s == 121.0 and budget.confirm_s == 121.0
    assert budget.may_search() and budget.searched_trials() == 2
    clock.now += 121.0  # trial 3: 669 s left, one more and the confirmation take 605
    assert budget.may_search()
    clock.now += 121.0
    assert not budget.may_search() and budget.confirm_fits()


def test_on_a_gpu_a_re_measurement_is_planned_at_its_share_until_one_is_measured() -> None:
    """The H200 code-trace study: trial 0 took 186 s, 1,014 s were left, four re-measurements
    held back. At the longest trial's cost for each, one more searched trial fit and then none;
    at GPU_CONFIRM_SHARE of it (they took 77 to 89 s there), two more."""
    clock = Clock()
    whole = Budget(ends=1200.0, confirm_trials=4, estimate_s=100.0, clock=clock)
    gpu = gpu_budget(1200.0, clock, estimate_s=100.0)
    for budget in (whole, gpu):
        budget.spent(186.0)
    clock.now = 186.0
    assert whole.searched_trials() == 1 and gpu.searched_trials() == 2
    assert gpu.confirm_s == pytest.approx(0.7 * 186.0)
    assert "about 186 s a trial, measured; 130 s a re-measurement" in gpu.plan(20, 2)
    clock.now = 186.0 + 150.0  # trial 1 ran: 864 s left
    assert not whole.may_search() and gpu.may_search()
    # Once a re-measurement is measured, the longest measured plans the rest of them.
    gpu.spent(95.0, confirming=True)
    assert gpu.confirm_s == 95.0 and gpu.trial_s == 186.0
    clock.now = 1200.0 - 94.0
    assert not gpu.may_confirm()


def test_a_budget_too_small_for_the_confirmation_says_so() -> None:
    budget = Budget(ends=150.0, confirm_trials=2, estimate_s=100.0, clock=Clock())
    assert not budget.confirm_fits() and budget.searched_trials() == 0
    said = budget.plan(4, 1)
    assert "too small for the confirmation (2 measurements" in said
    assert "the baseline will be kept unless it misses the SLOs" in said


@pytest.mark.parametrize(
    ("top_k", "repeats", "candidates", "trials"),
    [(1, 1, 0, 2), (1, 3, 0, 6), (1, 2, 2, 8), (1, 3, 1, 9), (0, 2, 0, 0), (1, 0, 0, 0)],
)
def test_the_confirmation_counts_the_finalist_the_baseline_and_the_candidates(
    top_k: int, repeats: int, candidates: int, trials: int
) -> None:
    assert confirm_trials(top_k, repeats, candidates) == trials


def test_the_first_contender_is_searched_for_with_room_for_one_turn_of_the_confirmation() -> None:
    """The H200 Mooncake study of benchmarks/results/h200-mooncake-user/: the defaults' trial
    took 249 s and left 908 s; one more trial and four re-measurements, planned at 249 + 4 x
    174 s, did not fit, and the run ended with nothing but the defaults measured. Until a
    contender exists, a trial need leave room only for the first turn (two re-measurements)."""
    clock = Clock()
    budget = gpu_budget(1200.0, clock, contender=False)
    budget.spent(249.0)
    clock.now = 292.0
    assert budget.held_s == pytest.approx(2 * 0.7 * 249.0)
    assert budget.may_search() and budget.searched_trials() == 1
    said = budget.plan(20, 2)
    assert "about 1 of the 20 trials, then as much of the confirmation as the time left" in said
    assert "a larger --time-budget-s confirms in full" in said
    # The same budget with a contender already measured holds the whole confirmation back.
    whole = dataclasses.replace(budget, contender=True)
    assert not whole.may_search() and whole.searched_trials() == 0
    # The next trial served: the search stops, and the confirmation runs as far as it fits.
    budget.spent(218.0)
    budget.contender = True
    clock.now = 510.0
    assert not budget.may_search() and budget.confirm_fits() and budget.may_confirm()
    assert "as much of the confirmation as the time left holds" in budget.plan(20, 2)
    for took in (147.0, 141.0, 126.0):
        budget.spent(took, confirming=True)
        clock.now += took
        assert budget.may_confirm()
    assert budget.left_s == pytest.approx(276.0)  # the fourth, planned at 147 s, still fits


def test_without_a_budget_the_run_says_what_it_will_take() -> None:
    """No end: the trials asked for and the whole confirmation at the planned costs, from the
    estimate, then from what the trials took."""
    budget = Budget(ends=math.inf, confirm_trials=6, estimate_s=300.0, clock=Clock())
    said = budget.eta(20, 3)
    assert said.startswith("no time budget: 20 more trials and the confirmation")
    assert "take about 2.2 h (about 300 s a trial, estimated; 300 s a re-measurement)" in said
    budget.spent(120.0)
    assert "take about 26 min (about 120 s a trial, measured" in budget.eta(7, 3)
    alone = Budget(ends=math.inf, confirm_trials=0, estimate_s=60.0, clock=Clock())
    assert alone.eta(1, 3).startswith("no time budget: 1 more trial takes about 1 min")


def test_the_plan_names_the_candidates_the_confirmation_measures_again() -> None:
    """A spec that confirms its candidates (``confirm_candidates``) holds their re-measurements
    back too, and the plan says what they are."""
    budget = Budget(
        ends=10_000.0, confirm_trials=3 * (2 + 1), estimate_s=100.0, clock=lambda: 0.0,
        candidates=1,
    )  # fmt: skip
    said = budget.plan(20, 3)
    words = "the finalist and the baseline, 3 fresh measurements each, and the 1 candidate 3 more"
    assert f"{words} times" in said
    two = Budget(ends=1e9, confirm_trials=3 * 4, estimate_s=100.0, clock=lambda: 0.0, candidates=2)
    assert "and the 2 candidates 3 more times each" in two.eta(5, 3)
    assert "candidate" not in Budget(ends=1e9, confirm_trials=6, estimate_s=1.0).plan(5, 3)


def test_a_confirmation_alone_plans_from_its_measurements_after_the_first() -> None:
    """``--confirm-only`` on one H200 (benchmarks/results/h200-gpus-one-confirmed/): the first
    fresh measurement took 126 s (the launcher's start and the process's first engine start),
    the next four 93, 94, 82 and 82 s, and 121 s were left for the sixth. Planned at the first,
    it did not fit; planned at the longest after it, it does. A confirmation after a search in
    the same run keeps every measurement in the plan."""
    clock = Clock()
    alone = gpu_budget(610.0, clock)
    for took in (126.0, 93.0, 94.0, 82.0, 82.0):
        alone.spent(took, confirming=True)
    clock.now = 610.0 - 121.0
    assert alone.confirm_s == 94.0 and alone.may_confirm()
    first = gpu_budget(610.0, Clock())
    first.spent(126.0, confirming=True)
    assert first.confirm_s == 126.0  # the only one measured still plans the next
    searched = gpu_budget(1200.0, clock)
    searched.spent(170.0)
    for took in (126.0, 93.0):
        searched.spent(took, confirming=True)
    assert searched.confirm_s == 126.0


def test_a_later_trial_is_priced_from_the_first_s_start_and_a_later_search_s_windows() -> None:
    """One H100, the README's capacity study: trial 0 took 380 s, of which 249 s a capacity
    search of 9 windows (the rest its cold start and warm-up); the two later engines took 135
    and 89 s. Priced at 380 s (and a re-measurement at 0.7 of it), a 1200 s budget bought no
    second configuration; priced at its start and warm-up and 3 windows of its seconds a
    window (214 s), it buys one, and the confirmation's first turn still fits after it."""
    clock = Clock()
    budget = gpu_budget(1200.0, clock, contender=False)
    budget.spent(380.0, parts=Parts(measure_s=249.0, windows=9))
    clock.now = 380.0
    assert budget.trial_s == pytest.approx(380.0 - 249.0 * (1 - LATER_WINDOWS / 9))
    assert budget.trial_s == pytest.approx(214.0)
    assert budget.confirm_s == pytest.approx(GPU_CONFIRM_SHARE * 214.0)
    assert budget.may_search() and budget.searched_trials() == 1
    unpriced = gpu_budget(1200.0, clock, contender=False)
    unpriced.spent(380.0)
    assert not unpriced.may_search() and unpriced.searched_trials() == 0
    # Once a later trial is measured, the longest after the first plans the rest.
    budget.spent(135.0, parts=Parts(measure_s=80.0, windows=3))
    assert budget.trial_s == 135.0 and budget.confirm_s == 135.0


def test_a_first_trial_of_few_windows_or_none_is_priced_as_it_took() -> None:
    """A latency trial's one replay, a capacity search already within the later windows, or
    an engine that never measured (no parts): the first's own seconds plan the next."""
    for parts in (Parts(measure_s=60.0, windows=1), Parts(60.0, LATER_WINDOWS), None):
        budget = Budget(ends=1000.0, confirm_trials=2, estimate_s=50.0, clock=Clock())
        budget.spent(150.0, parts=parts)
        assert budget.trial_s == 150.0
    # Only the run's first searched trial's parts price: a confirming measurement's do not.
    budget = Budget(ends=1000.0, confirm_trials=2, estimate_s=50.0, clock=Clock())
    budget.spent(100.0, confirming=True, parts=Parts(60.0, 9))
    assert budget.first_parts is None


def test_a_trial_s_parts_are_read_from_its_record() -> None:
    timed = optuna.trial.create_trial(
        value=12.0,
        user_attrs={f"{TIME_PREFIX}{WINDOW_S}": 249.0, RATES_ATTR: 9.0, CAPACITY_ATTR: 12.0},
    )
    assert Parts.of(timed) == Parts(measure_s=249.0, windows=9)
    latency = optuna.trial.create_trial(value=0.4, user_attrs={f"{TIME_PREFIX}{WINDOW_S}": 60.0})
    assert Parts.of(latency) == Parts(measure_s=60.0, windows=1)
    assert Parts.of(optuna.trial.create_trial(value=0.0)) is None  # its engine never served


def test_the_plan_says_the_fresh_measurements_it_buys_and_is_said_again_of_the_trials_left() -> (
    None
):
    clock = Clock()
    budget = Budget(ends=1000.0, confirm_trials=6, estimate_s=100.0, clock=clock, contender=False)
    budget.spent(100.0)
    clock.now = 100.0
    # 900 s left: 3 more trials, then the whole confirmation, 6 x 100 s.
    said = budget.plan(20, 3, ran=1)
    assert said.startswith("the budget buys about 3 more of the 19 trials left, then the finalist")
    # 500 s left: one more trial (no contender yet: it leaves room for the first turn only),
    # then 400 s, which hold 4 of the 6 fresh measurements.
    clock.now = 500.0
    said = budget.plan(20, 3, ran=5)
    assert "about 1 more of the 15 trials left, then as much of the confirmation" in said
    assert "about 4 of its 6 fresh measurements" in said
