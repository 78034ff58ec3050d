"""The rank test behind "beats vLLM's defaults": exact shares of ways counted by hand, and the
cases where it agrees with "better in every measurement" and where it does not."""

from __future__ import annotations

import pytest

from tuner.study.trials.significance import beats, one_sided_p, pairs_won


def higher(value: float, than: float) -> bool:
    return value > than


def lower(value: float, than: float) -> bool:
    return value < than


def test_pairs_count_a_tie_as_half() -> None:
    # The H200 conversation study: 2048 against vLLM's defaults, capacities in req/s.
    assert pairs_won([29.5, 26.8, 28.2], [26.8, 24.4, 25.6], higher) == 8.5


@pytest.mark.parametrize(
    ("values", "others", "share"),
    [
        ([3, 4, 5], [0, 1, 2], 1 / 20),  # one way of C(6, 3) = 20 wins all nine pairs
        ([29.5, 26.8, 28.2], [26.8, 24.4, 25.6], 2 / 20),  # either 26.8 in the first set
        ([4, 5, 6, 7], [0, 1, 2, 3], 1 / 70),
        ([3.5, 5, 6, 7], [0, 1, 2, 4], 2 / 70),  # one pair lost: 15 of 16
        ([0, 1, 2], [3, 4, 5], 1.0),
    ],
)
def test_the_share_of_ways_is_exact(values, others, share) -> None:
    assert one_sided_p(values, others, higher) == pytest.approx(share)


def test_three_against_three_is_better_in_every_measurement() -> None:
    """At the confirm step's default, only a clean sweep is rare enough, as before."""
    assert beats([3, 4, 5], [0, 1, 2], higher)
    assert not beats([29.5, 26.8, 28.2], [26.8, 24.4, 25.6], higher)  # kept the defaults
    assert not beats([3, 4, 1.5], [0, 1, 2], higher)


def test_more_measurements_show_a_gain_that_overlaps_once() -> None:
    """Four against four, one measurement of the winner below one of the defaults: 2 ways in
    70, beyond chance, where "better in every measurement" would keep the defaults."""
    assert beats([3.5, 5, 6, 7], [0, 1, 2, 4], higher)
    assert not beats([1.5, 3.5, 6, 7], [0, 1, 2, 4], higher)  # 13 of 16 pairs: 7 ways in 70


def test_too_few_measurements_ask_for_every_one() -> None:
    """Two against two has six ways: none as rare as one in twenty."""
    assert beats([3, 4], [1, 2], higher)
    assert not beats([3, 1.5], [1, 2], higher)
    assert not beats([], [1, 2], higher) and not beats([3], [], higher)


def test_the_direction_is_the_objectives() -> None:
    """A latency study's score: lower is better."""
    assert beats([0.5, 0.55, 0.52], [1.0, 1.05, 0.98], lower)
    assert not beats([1.0, 1.05, 0.98], [0.5, 0.55, 0.52], lower)


def test_many_measurements_are_sampled_the_same_way_each_time() -> None:
    values = [10.0 + i for i in range(9)]
    others = [5.0 + i for i in range(9)]
    p = one_sided_p(values, others, higher)
    assert p == one_sided_p(values, others, higher)
    assert 0.0 < p < 0.01
