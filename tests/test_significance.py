"""The rank test behind "beats vLLM's defaults on fresh engines" and the gain's interval: exact
p values counted by hand, the rule's false-positive rate on draws where both are the same, and
intervals read off the pairwise ratios."""

from __future__ import annotations

import math
import random

import pytest

from tuner.study.trials.significance import (
    beats,
    fewest_fresh,
    in_every_pair,
    p_value,
    pairs_won,
    ratio,
    ratio_interval,
    shift_interval,
)


def test_pairs_count_a_tie_as_half() -> None:
    # The H200 conversation study: 2048 against vLLM's defaults, capacities in req/s.
    assert pairs_won([29.5, 26.8, 28.2], [26.8, 24.4, 25.6]) == 8.5


@pytest.mark.parametrize(
    ("values", "others", "p"),
    [
        ([3, 4, 5], [0, 1, 2], 1 / 20),  # one order of C(6, 3) = 20 puts all three first
        ([4, 5, 6, 7], [0, 1, 2, 3], 1 / 70),
        ([3.5, 5, 6, 7], [0, 1, 2, 4], 2 / 70),  # one pair lost: 15 of 16
        ([0, 1, 2], [3, 4, 5], 1.0),
    ],
)
def test_the_p_value_is_exact(values, others, p) -> None:
    assert p_value(values, others) == pytest.approx(p)


def test_three_fresh_each_is_the_fewest_for_one_in_twenty() -> None:
    assert fewest_fresh(0.05) == 3  # C(6, 3) = 20
    assert fewest_fresh(0.01) == 5  # C(8, 4) = 70 is not enough, C(10, 5) = 252 is


def test_only_a_sweep_of_as_many_of_each_beats() -> None:
    assert beats([3, 4, 5], [0, 1, 2])
    assert not beats([29.5, 26.8, 28.2], [26.8, 24.4, 25.6])  # a tie is not a win
    assert not beats([3, 4, 1.5], [0, 1, 2])
    assert not beats([3, 4], [1, 2])  # two against two: one order in 6
    assert not beats([3, 4, 5, 6], [0, 1, 2])  # unequal counts
    assert not beats([], [1, 2]) and not beats([3], [])


def test_a_measurement_that_missed_the_slos_ranks_below_every_other() -> None:
    assert in_every_pair([3, 4, 5], [-math.inf, 1, 2])
    assert not in_every_pair([3, -math.inf, 5], [0, 1, 2])
    assert p_value([3, 4, 5], [-math.inf, -math.inf, 2]) == pytest.approx(1 / 20)


def test_the_rule_writes_one_in_twenty_at_most_where_both_are_the_same() -> None:
    """Draws of one distribution for both, continuous and on a rate ladder (ties): the share
    that beats is 1/20 at most (ties only lower it)."""
    rng = random.Random(7)
    for ladder in (False, True):
        wins = 0
        for _ in range(6000):
            draw = [rng.lognormvariate(0, 0.1) for _ in range(6)]
            if ladder:
                draw = [round(math.log(v) / math.log(1.1)) for v in draw]
            wins += beats(draw[:3], draw[3:])
        assert wins / 6000 <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / 6000)
        if not ladder:
            assert wins / 6000 >= 0.05 - 3 * math.sqrt(0.05 * 0.95 / 6000)


def test_the_interval_at_three_against_three_spans_the_pairwise_ratios() -> None:
    """90 %: from the smallest to the largest ratio of one fresh measurement of each; the upper
    end widened by the capacity search's resolution, the lower end (the test's own bound) not."""
    mine, theirs = [7.48, 7.48, 8.2], [4.65, 4.65, 5.1]
    low, high = ratio_interval(mine, theirs) or (0.0, 0.0)
    assert low == pytest.approx(7.48 / 5.1) and high == pytest.approx(8.2 / 4.65)
    wide = ratio_interval(mine, theirs, resolution=0.1) or (0.0, 0.0)
    assert wide == pytest.approx((7.48 / 5.1, 8.2 / 4.65 * 1.1))
    assert ratio(mine, theirs) == pytest.approx(7.48 / 4.65)


@pytest.mark.parametrize("n", [3, 4])
def test_the_interval_excludes_one_exactly_where_the_test_finds_better(n: int) -> None:
    """The lower end is the bound of the rank test behind a verdict: above 1.0x wherever
    ``beats`` holds (one rung of a 10 % ladder apart included, where widening the lower end by
    the resolution put it at 1.0x or below); at three against three, only there."""
    rng = random.Random(n)
    checked = 0
    for _ in range(300):
        rungs = [rng.choice((10, 11, 12)) for _ in range(2 * n)]
        mine, theirs = [1.1**r for r in rungs[:n]], [1.1**r for r in rungs[n:]]
        interval = ratio_interval(mine, theirs, resolution=0.1)
        assert interval is not None
        found = beats(mine, theirs)
        if found or n == 3:
            assert (interval[0] > 1.0) == found, (mine, theirs, interval)
        checked += found
    assert checked > 0


def test_a_measurement_that_missed_the_slos_ranks_below_every_other_in_the_interval() -> None:
    """0 on the ratio scale (-inf as a log), as the test ranks it: its pairs are the finalist's
    at any shift, so the lower end comes from the baseline's other measurements."""
    mine, theirs = [2.0, 2.2, 2.4], [0.0, 1.0, 1.5]
    assert beats(mine, theirs)
    low, high = ratio_interval(mine, theirs) or (0.0, 0.0)
    assert low == pytest.approx(2.0 / 1.5) and math.isinf(high)
    # Each of the baseline's measurements missed: the test rejects at every shift.
    assert ratio_interval(mine, [0.0, 0.0, 0.0]) == (math.inf, math.inf)


def test_more_measurements_narrow_the_interval_inside_the_extremes() -> None:
    mine = [1.0, 1.1, 1.2, 1.3, 1.25, 1.15]
    theirs = [1.0, 1.05, 1.1, 0.9, 0.95, 1.02]
    low, high = shift_interval(mine, theirs)
    diffs = sorted(a - b for a in mine for b in theirs)
    assert diffs[0] < low <= high < diffs[-1]


def test_too_few_measurements_leave_the_interval_open() -> None:
    assert shift_interval([2.0, 2.0], [1.0, 1.0]) == (-math.inf, math.inf)
    assert ratio_interval([2.0, 2.0], [1.0, 1.0]) == (0.0, math.inf)
    assert ratio_interval([2.0, -1.0, 1.0], [1.0, 1.0, 1.0]) is None
    assert ratio_interval([2.0, math.inf, 1.0], [1.0, 1.0, 1.0]) is None
