"""The rank test that looks at 4, 6 and 8 fresh measurements of each: its exact chance of
writing a finalist no better than the baseline (computed, then drawn), and what it decides."""

from __future__ import annotations

import math
import random

import pytest

from tuner.study.trials.sequential import (
    ABBA,
    AGAINST,
    LOOKS,
    WRITE,
    null_write_chance,
    sequential_plan,
    single_look_p,
    u_count,
)
from tuner.study.trials.significance import ALPHA


def test_one_look_at_three_against_three_is_one_in_twenty():
    # The exact computation agrees with C(6, 3): the finalist's 3 all above the baseline's 3.
    assert null_write_chance((3,), (9,)) == pytest.approx(1 / 20)
    assert null_write_chance((4,), (16,)) == pytest.approx(1 / 70)
    assert single_look_p(16, 4) == pytest.approx(1 / 70)
    assert single_look_p(15, 4) == pytest.approx(2 / 70)


def test_the_plan_s_exact_size_is_at_most_alpha_over_its_looks():
    chosen = sequential_plan()
    assert chosen.looks == LOOKS and chosen.critical == (16, 31, 51)
    assert chosen.size <= ALPHA
    assert chosen.size == pytest.approx(null_write_chance(chosen.looks, chosen.critical))
    # Each look alone at its critical count is below alpha, and looking three times costs more
    # than the largest of them: the size is spent over the looks.
    alone = [single_look_p(c, n) for n, c in zip(chosen.looks, chosen.critical, strict=True)]
    assert max(alone) < chosen.size


def draw(rng: random.Random, gain: float, ladder: bool) -> float:
    value = math.log(gain) + rng.gauss(0.0, 0.1)
    return math.floor(value / math.log(1.1)) if ladder else value


def run(rng: random.Random, gain: float, ladder: bool = False) -> tuple[str, int]:
    """One round in ABBA order until the plan decides: what, and after how many measurements."""
    chosen = sequential_plan()
    mine: list[float] = []
    theirs: list[float] = []
    for index in range(2 * chosen.looks[-1]):
        side = mine if ABBA[index % len(ABBA)] else theirs
        side.append(draw(rng, gain if side is mine else 1.0, ladder))
        decided = chosen.decide(mine, theirs) if len(mine) == len(theirs) else None
        if decided is not None:
            return decided, index + 1
    raise AssertionError("the last look decides")


@pytest.mark.parametrize("ladder", [False, True])
def test_drawn_null_rounds_write_as_often_as_computed_and_ties_only_lower_it(ladder):
    rng = random.Random(7)
    rounds = 20000
    written = sum(run(rng, 1.0, ladder)[0] == WRITE for _ in range(rounds))
    size = sequential_plan().size
    slack = 3 * math.sqrt(size * (1 - size) / rounds)
    assert written / rounds <= size + slack
    if not ladder:
        assert written / rounds >= size - slack


def test_one_low_engine_of_the_finalist_no_longer_decides_against_it():
    # The finalist better than the baseline on each fresh engine but one, which reads 35% low:
    # 3 against 3 stops at that pair; the looks go on and write at 8 each.
    chosen = sequential_plan()
    mine = [1.3, 1.32, 0.6, 1.29, 1.31, 1.33, 1.28, 1.3]
    theirs = [1.0, 1.02, 0.98, 1.01, 0.99, 1.0, 1.03, 0.97]
    assert chosen.decide(mine[:4], theirs[:4]) is None
    assert chosen.decide(mine[:6], theirs[:6]) is None
    assert chosen.decide(mine, theirs) == WRITE
    assert u_count(mine, theirs) == 56


def test_a_finalist_behind_in_half_the_pairs_or_more_stops_at_the_first_look():
    chosen = sequential_plan()
    assert chosen.decide([1.0, 0.9, 1.1, 0.95], [1.0, 1.05, 0.97, 1.02]) == AGAINST
    assert chosen.decide([1.0, 0.9, 1.1], [1.0, 1.05, 0.97]) is None  # before the first look


def test_a_real_gain_is_written_more_often_and_sooner_than_none():
    rng = random.Random(3)
    better = [run(rng, 1.3) for _ in range(400)]
    same = [run(rng, 1.0) for _ in range(400)]
    assert sum(d == WRITE for d, _ in better) / 400 > 0.8
    assert sum(n for _, n in same) / 400 < 2 * LOOKS[-1]  # most null rounds stop early
