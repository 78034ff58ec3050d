"""Whether one configuration's measurements beat another's beyond chance, and by how much.

The confirmation (``tuner.study.trials.confirm``) measures the search's finalist and the
baseline on fresh engines, in turns, and engines of one configuration differ (a pooled SD of
0.086 in log capacity on GPUs, one engine in several reading 30 to 40 % low; more on a shared
CPU). The finalist beats the baseline where each of its fresh measurements is better than each
of the baseline's (``in_every_pair``), with as many of each and at least ``MIN_FRESH``. Were the
two configurations the same, every order of the ``2n`` measurements would be as likely, and
the one where the finalist's ``n`` all come first has probability ``1 / C(2n, n)``: 1/20 at
three against three, the exact one-sided Mann-Whitney p (``p_value``, scipy's). Ties count
against the finalist, so they only lower that chance. Since only fresh measurements count, the
search that chose the finalist among many does not enter the test: its false-positive rate is
at most 1/20 whatever the number of configurations searched.

``ratio_interval`` is how much better, with its interval: the Hodges-Lehmann-style interval of
the shift in log values that inverts the same rank test (every shift the test does not reject
at ``(1 - confidence) / 2`` on either side), as a ratio. At three against three its 90 % interval
runs from the smallest to the largest ratio of a fresh measurement of each. Its lower end is
the one-sided bound of the test that wrote the verdict (at ``ALPHA``, 90 % being two-sided): it
is above 1.0x exactly where that test rejects "no better", so a written verdict's interval
never holds 1.0x. A measurement that missed the SLOs carried nothing within them (0 on the ratio
scale, ``-inf`` as a log): the test ranks it below every other, and so does the interval.

Values here are *oriented*: higher is better, whatever the study's direction (a capacity as it
is; a latency score negated), and a measurement that missed the SLOs is ``-inf``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any

# The chance, at most, that a finalist no better than the baseline is written.
ALPHA = 0.05
# The fewest fresh measurements of each for a test at ``ALPHA``: C(6, 3) = 20.
MIN_FRESH = 3
# The gain's interval, as printed.
CONFIDENCE = 0.9


def mannwhitneyu(*args: Any, **kwargs: Any) -> Any:
    """scipy's exact Mann-Whitney test, imported on the first call: scipy.stats takes most of a
    second to import, which every ``tuner`` command would pay at its start."""
    from scipy.stats import mannwhitneyu as test

    return test(*args, **kwargs)


def fewest_fresh(alpha: float = ALPHA) -> int:
    """The fewest fresh measurements of each configuration for which ``n`` against ``n``, all
    in the finalist's favour, is at most ``alpha`` under chance."""
    n = 1
    while 1 / math.comb(2 * n, n) > alpha:
        n += 1
    return n


def in_every_pair(values: Sequence[float], others: Sequence[float]) -> bool:
    """Whether each of ``values`` is strictly better than each of ``others`` (a tie is not)."""
    return bool(values) and bool(others) and min(values) > max(others)


def pairs_won(values: Sequence[float], others: Sequence[float]) -> float:
    """Over every pair of a value of each, how often ``values``' is better (a tie: half)."""
    won = 0.0
    for value in values:
        for other in others:
            won += 1.0 if value > other else 0.5 if value == other else 0.0
    return won


def p_value(values: Sequence[float], others: Sequence[float]) -> float:
    """The exact one-sided Mann-Whitney p that ``values`` are better than ``others`` (scipy's);
    1 where either is empty."""
    if not values or not others:
        return 1.0
    finite = _finite([*values, *others])
    result = mannwhitneyu(
        [finite(v) for v in values], [finite(v) for v in others],
        alternative="greater", method="exact",
    )  # fmt: skip
    return float(result.pvalue)


def beats(values: Sequence[float], others: Sequence[float], alpha: float = ALPHA) -> bool:
    """Whether ``values`` beat ``others`` beyond chance: as many of each, at least
    ``fewest_fresh(alpha)``, and each better than each (``p_value`` at most ``alpha``)."""
    n = len(values)
    return (
        n == len(others)
        and n >= fewest_fresh(alpha)
        and in_every_pair(values, others)
        and p_value(values, others) <= alpha + 1e-12
    )


def shift_interval(
    values: Sequence[float], others: Sequence[float], confidence: float = CONFIDENCE
) -> tuple[float, float]:
    """The shifts ``d`` of ``values`` for which the rank test of ``values - d`` against
    ``others`` rejects neither side at ``(1 - confidence) / 2``: the interval of how much
    ``values`` are above ``others``. An end is infinite where too few measurements bound it
    (or, where ``-inf`` values decide every pair, where the test rejects at every shift)."""
    lower = _lowest_shift(values, others, (1 - confidence) / 2)
    upper = -_lowest_shift(others, values, (1 - confidence) / 2)
    return lower, upper


def ratio_interval(
    values: Sequence[float],
    others: Sequence[float],
    confidence: float = CONFIDENCE,
    resolution: float = 0.0,
) -> tuple[float, float] | None:
    """How many times ``values`` (positive, or 0 for a measurement that missed the SLOs;
    oriented so that higher is better) are ``others``: the ``shift_interval`` of their logs, as
    ratios. The upper end is widened by ``1 + resolution`` (a capacity is known only to within
    its search's resolution); the lower end is not: it is the bound of the rank test itself,
    above 1.0x exactly where the test finds ``values`` better. None where a value is negative or
    infinite."""
    pooled = [*values, *others]
    if not values or not others or min(pooled) < 0 or not all(math.isfinite(v) for v in pooled):
        return None
    low, high = shift_interval(_logs(values), _logs(others), confidence)
    return _exp(low), _exp(high) * (1.0 + resolution)


def ratio(values: Sequence[float], others: Sequence[float]) -> float | None:
    """The ratio of the medians of two sets of positive values; None where one is not."""
    if not values or not others:
        return None
    mine, theirs = _median(values), _median(others)
    if mine <= 0 or theirs <= 0 or math.isinf(mine) or math.isinf(theirs):
        return None
    return mine / theirs


def _lowest_shift(values: Sequence[float], others: Sequence[float], alpha: float) -> float:
    """The lowest shift the one-sided test of ``values - d`` above ``others`` does not reject at
    ``alpha``: between two finite pairwise differences the test's statistic is constant, so
    each gap is tried at its middle (a pair with a ``-inf`` value is decided at every shift)."""
    diffs = sorted({v - o for v in values for o in others if math.isfinite(v - o)})
    if not diffs:
        return -math.inf if p_value(values, others) > alpha + 1e-12 else math.inf
    gaps = [diffs[0] - 1.0, *((a + b) / 2 for a, b in itertools.pairwise(diffs))]
    gaps.append(diffs[-1] + 1.0)
    for index, shift in enumerate(gaps):
        if p_value([v - shift for v in values], others) > alpha + 1e-12:
            return -math.inf if index == 0 else diffs[index - 1]
    return math.inf


def _finite(pooled: Sequence[float]) -> Callable[[float], float]:
    """A map of ``-inf`` (a measurement that missed the SLOs) below every finite value, for
    scipy's ranks."""
    finite = [v for v in pooled if not math.isinf(v)]
    floor = (min(finite) - 1.0) if finite else 0.0
    return lambda v: floor if v == -math.inf else v


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    return (ordered[middle - 1] + ordered[middle]) / 2


def _logs(values: Sequence[float]) -> list[float]:
    return [math.log(v) if v > 0 else -math.inf for v in values]


def _exp(value: float) -> float:
    if math.isinf(value):
        return math.inf if value > 0 else 0.0
    return math.exp(value)
