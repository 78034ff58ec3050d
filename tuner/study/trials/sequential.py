"""A rank test that looks several times: the finalist's fresh measurements against the
baseline's at ``LOOKS`` (4, 6 and 8 of each), stopped at the first look where the evidence is
clear either way, with an exact size of at most ``ALPHA`` over all its looks.

At a look of ``n`` measurements of each, the statistic is the Mann-Whitney count ``U``: of the
``n * n`` pairs of a measurement of each, how many the finalist's is strictly better in (a tie,
which a capacity read on a ladder often is, counts against it, so ties only lower the chance of
writing). A look **writes** where ``U`` reaches its critical count (``Plan.critical``), **stops
against** where the finalist is better in at most half the pairs (before the last look; at the
last, whatever does not write stops against), and otherwise goes on to the next look.

The critical counts share one nominal level: at each look, the smallest ``U`` whose one-sided
exact Mann-Whitney p at that look alone (scipy's) is at most the level; the level is the largest
p attained at some look for which the chance of writing at *any* look, were the two
configurations the same, is at most ``ALPHA``. That chance is computed exactly
(``null_write_chance``): under the null every order of the measurements is as likely, so the
ranks are built one measurement at a time in the order they are taken (each new one equally
likely in each place among those before it), and the chance mass of each order of the two
configurations' labels is carried from look to look. The stops against are not counted in it
(they are not binding: a rule that went on past one would still be at most ``ALPHA``).

Unlike three against three, every pair in the finalist's favour, one engine reading low no
longer decides against it: the round goes on to the next look. At the default looks the plan
writes with 16 of 16 pairs at 4 each, 31 of 36 at 6 and 51 of 64 at 8 (an exact size of 4.2 %);
one low engine of either costs at most 8 pairs at 8 each.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

from tuner.study.trials.significance import ALPHA, mannwhitneyu

# The fresh measurements of each at which the test looks.
LOOKS = (4, 6, 8)
WRITE = "write"
AGAINST = "against"
# The order fresh measurements are taken in, repeated: finalist, baseline, baseline, finalist.
ABBA = (True, False, False, True)


def u_count(values: Sequence[float], others: Sequence[float]) -> int:
    """How many pairs of a value of each ``values``' is strictly better in (a tie is not)."""
    return sum(1 for v in values for o in others if v > o)


@cache
def single_look_p(u: int, n: int) -> float:
    """The exact one-sided Mann-Whitney p of a count ``u`` at ``n`` against ``n`` (scipy's),
    from two samples made to have that count."""
    beaten = [min(n, max(0, u - i * n)) for i in range(n)]
    others = [2.0 * j for j in range(n)]
    values = [2.0 * b - 1.0 for b in beaten]
    result = mannwhitneyu(values, others, alternative="greater", method="exact")
    return float(result.pvalue)


@dataclass(frozen=True)
class Plan:
    """The looks (fresh measurements of each at which the test decides), the critical count of
    each (a count at or above it writes) and the chance of writing at any look under the null."""

    looks: tuple[int, ...]
    critical: tuple[int, ...]
    size: float

    def decide(self, values: Sequence[float], others: Sequence[float]) -> str | None:
        """``WRITE``, ``AGAINST`` or None (go on) for the fresh measurements so far, read at the
        last look they both reach (None before the first)."""
        n = min(len(values), len(others))
        reached = [k for k, look in enumerate(self.looks) if look <= n]
        if not reached:
            return None
        k = reached[-1]
        look = self.looks[k]
        u = u_count(values[:look], others[:look])
        if u >= self.critical[k]:
            return WRITE
        if k == len(self.looks) - 1 or 2 * u <= look * look:
            return AGAINST
        return None


def null_write_chance(looks: Sequence[int], critical: Sequence[int]) -> float:
    """The exact chance that a finalist no better than the baseline is written at some look,
    its measurements taken in ABBA order (the stops against not counted)."""
    return _null_write_chance(tuple(looks), tuple(critical))


@cache
def _null_write_chance(looks: tuple[int, ...], critical: tuple[int, ...]) -> float:
    # A state: the labels in rank order, lowest first (True: the finalist's), and its chance.
    states: dict[tuple[bool, ...], float] = {(): 1.0}
    written = 0.0
    taken = {True: 0, False: 0}
    pending = list(zip(looks, critical, strict=True))
    for index in range(2 * looks[-1]):
        label = ABBA[index % len(ABBA)]
        taken[label] += 1
        states = _insert(states, label)
        if pending and taken[True] == taken[False] == pending[0][0]:
            _, count = pending.pop(0)
            kept: dict[tuple[bool, ...], float] = {}
            for order, chance in states.items():
                if _u_of(order) >= count:
                    written += chance
                else:
                    kept[order] = chance
            states = kept
    return written


def _insert(states: dict[tuple[bool, ...], float], label: bool) -> dict[tuple[bool, ...], float]:
    """Each order with a new measurement (``label``) in each of its places, equally likely."""
    after: dict[tuple[bool, ...], float] = {}
    for order, chance in states.items():
        share = chance / (len(order) + 1)
        for place in range(len(order) + 1):
            grown = (*order[:place], label, *order[place:])
            after[grown] = after.get(grown, 0.0) + share
    return after


def _u_of(order: tuple[bool, ...]) -> int:
    """The finalist's count in an order of labels, lowest first."""
    below = u = 0
    for finalist in order:
        if finalist:
            u += below
        else:
            below += 1
    return u


@cache
def sequential_plan(looks: tuple[int, ...] = LOOKS, alpha: float = ALPHA) -> Plan:
    """The plan whose looks share the largest nominal level at which the exact chance of
    writing under the null is at most ``alpha``."""
    levels = sorted({single_look_p(u, n) for n in looks for u in range(n * n + 1)})
    best: Plan | None = None
    for level in levels:
        critical = tuple(_critical_at(n, level) for n in looks)
        size = null_write_chance(looks, critical)
        if size > alpha + 1e-12:
            break
        best = Plan(looks, critical, size)
    if best is None:
        raise ValueError(f"no plan at {looks} holds the size to {alpha}")
    return best


def _critical_at(n: int, level: float) -> int:
    """The smallest count at ``n`` against ``n`` whose single-look p is at most ``level``
    (``n * n + 1``, never reached, where none is)."""
    return next(
        (u for u in range(n * n + 1) if single_look_p(u, n) <= level + 1e-12),
        n * n + 1,
    )
