"""Whether one configuration's measurements are better than another's beyond chance.

The confirm step measures configurations on fresh engines, in turns, and engines of one
configuration differ (by up to a third on the H100s measured). A configuration beats another
where an exact one-sided rank test says so: count, over every pair of a measurement of each, how
often the first is better (a tie counts half); then, of every way to deal all the measurements
into two sets of the same sizes, the share that gives the first set a count as high. If the two
configurations were the same, each way would be as likely, so a share of at most ``ALPHA`` is
a gain that chance explains one time in twenty or less.

At three measurements against three (the confirm step's default) only one way in 20 is that
rare: the one where each of the first's measurements is better than each of the other's, the
rule of "better in every measurement". With more measurements the test allows an overlap where
the rest of the ranks make up for it, so more re-measurements show a smaller gain, where "better
in every measurement" would only get harder to meet. Where the measurements are too few for
any way to be that rare (two against two: one in 6), better in every measurement is asked.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable, Sequence

# The share of ways, at most, for a gain to count as beyond chance: one in twenty.
ALPHA = 0.05
# Up to this many measurements in all, every way is counted (12,870 at 8 against 8); beyond,
# a fixed sample of ways.
EXACT_UP_TO = 16
SAMPLED_WAYS = 20_000

Better = Callable[[float, float], bool]


def pairs_won(values: Sequence[float], others: Sequence[float], better: Better) -> float:
    """Over every pair of a value of each, how often ``values``' is better (a tie: half)."""
    won = 0.0
    for value in values:
        for other in others:
            if better(value, other):
                won += 1.0
            elif not better(other, value):
                won += 0.5
    return won


def one_sided_p(values: Sequence[float], others: Sequence[float], better: Better) -> float:
    """The share of ways to deal all the values into sets of these sizes whose first set wins
    at least as many pairs as ``values`` does."""
    pooled = [*values, *others]
    n = len(values)
    won = pairs_won(values, others, better)

    def as_high(chosen: Sequence[int]) -> bool:
        picked = set(chosen)
        first = [pooled[i] for i in chosen]
        rest = [v for i, v in enumerate(pooled) if i not in picked]
        return pairs_won(first, rest, better) >= won - 1e-9

    if len(pooled) <= EXACT_UP_TO:
        ways = list(itertools.combinations(range(len(pooled)), n))
        return sum(1 for chosen in ways if as_high(chosen)) / len(ways)
    rng = random.Random(0)  # the same answer for the same measurements
    drawn = [rng.sample(range(len(pooled)), n) for _ in range(SAMPLED_WAYS)]
    # The measured way itself counts, so that a sampled share is never 0.
    return (1 + sum(1 for chosen in drawn if as_high(chosen))) / (1 + SAMPLED_WAYS)


def beats(values: Sequence[float], others: Sequence[float], better: Better) -> bool:
    """Whether ``values`` are better than ``others`` beyond chance (the module's test); where
    they are too few for that, whether each is better than each of ``others``."""
    if not values or not others:
        return False
    if math.comb(len(values) + len(others), len(values)) < round(1 / ALPHA):
        return in_every_measurement(values, others, better)
    return one_sided_p(values, others, better) <= ALPHA + 1e-12


def in_every_measurement(values: Sequence[float], others: Sequence[float], better: Better) -> bool:
    """Whether each of ``values`` is better than each of ``others``."""
    return bool(values) and bool(others) and all(better(v, o) for v in values for o in others)
