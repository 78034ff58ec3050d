"""The default search: from vLLM's defaults, one dimension at a time, moving with the incumbent.

Each searched dimension is a short ordered list of levels (``levels``): a categorical one its
choices in the order listed (so that numbers listed from the largest down move down first), a
log-scale one the powers of two in its range, a linear one at most ``MAX_LEVELS``
evenly spaced values; a numeric dimension's ``default`` within its range is a level too. The
incumbent is the best trial so far (the baseline, vLLM's defaults, until something beats it),
placed on the levels by its arguments: what it searched, else what it was started with, else
the dimension's ``default`` (vLLM's own value where the argument is not given), else the middle
level.

``next_point`` proposes, in this order, the first configuration no trial has taken:

1. the incumbent's own levels, where they are not a configuration already measured (the
   baseline is, when every dimension has a default);
2. one dimension moved: one level along its ladder (up, unless its levels are listed from the
   largest down), one level back, each dimension in the spec's order, then two levels, and so
   on to the ends of every dimension; a direction whose last two levels were both taken and
   lost to the incumbent goes no further here;
3. two dimensions moved one level each;
4. refining: halfway (geometrically on a log scale) between the incumbent's value and each
   neighbouring level of a numeric dimension;
5. the levels beyond two losses in a row that step 2 passed over.

Step 2's rule: on the measured CPU landscape (``benchmarks/results/cpu-search-landscape/``)
max-num-seqs 8 and 4 lost to 16, and 2 and 1 could only lose more; the trials they would take
go to the move that combines two dimensions.

After a trial beats the incumbent, the next proposals move from it. When nothing is left to
propose (every such configuration taken), ``next_point`` says so and the study's sampler (TPE)
draws the rest. Random draws over a range like 1..1024 spend most trials where nothing can win;
this spends them next to what already works.

Pure: the caller (``tuner.study.trials.search``) reads the study's trials into ``Taken`` points.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tuner.study.plan.spec import Dimension

# Levels of a linear dimension, at most (a log-scale one has a level per power of two).
MAX_LEVELS = 9

Point = tuple[Any, ...]


@dataclass(frozen=True)
class Taken:
    """A trial as the search sees it: its value of each dimension (None where unknown), whether
    it is measured and how good it was (``rank``, lower is better; None if not ranked: running,
    pruned, failed)."""

    values: Mapping[str, Any]
    rank: float | None = None


@dataclass(frozen=True)
class Proposal:
    """A configuration to measure next and why: ``move`` says which phase proposed it."""

    params: dict[str, Any]
    move: str


def _canonical(value: Any) -> Any:
    """A value as the study stores it (JSON), floats free of binary noise."""
    if isinstance(value, float):
        value = round(value, 10)
    return json.loads(json.dumps(value))


def _snap(dim: Dimension, value: float) -> Any:
    assert dim.low is not None and dim.high is not None
    if dim.step:
        value = dim.low + round((value - dim.low) / dim.step) * dim.step
    value = min(max(value, dim.low), dim.high)
    if dim.kind == "int":
        return round(value)
    return _canonical(float(value))


def levels(dim: Dimension) -> list[Any]:
    """The ordered values the search moves over for ``dim``."""
    if dim.kind == "categorical":
        return [_canonical(c) for c in dim.choices]
    assert dim.low is not None and dim.high is not None
    low, high = dim.low, dim.high
    if dim.log:
        values: list[float] = [low]
        power = 2.0 ** math.ceil(math.log2(low))
        while power < high:
            if power > low:
                values.append(power)
            power *= 2
        values.append(high)
    elif dim.step and (high - low) / dim.step + 1 <= MAX_LEVELS:
        count = round((high - low) / dim.step) + 1
        values = [low + i * dim.step for i in range(count)]
    elif dim.kind == "int" and not dim.step and high - low + 1 <= MAX_LEVELS:
        values = [low + i for i in range(int(high - low) + 1)]
    else:
        values = [low + (high - low) * i / (MAX_LEVELS - 1) for i in range(MAX_LEVELS)]
    if dim.has_default and isinstance(dim.default, int | float) and low <= dim.default <= high:
        # vLLM's own value is a level: the search starts from it, not from a level beside it.
        values.append(float(dim.default))
    snapped = sorted(_snap(dim, v) for v in values)
    return list(dict.fromkeys(snapped))


def _nearest(dim: Dimension, ladder: Sequence[Any], value: Any) -> int:
    """The index of the level nearest ``value`` (log distance on a log scale)."""
    if value in ladder:
        return ladder.index(value)
    if dim.kind == "categorical" or not isinstance(value, int | float):
        return (len(ladder) - 1) // 2
    if dim.log and value > 0:
        return min(range(len(ladder)), key=lambda i: abs(math.log(ladder[i] / value)))
    return min(range(len(ladder)), key=lambda i: abs(ladder[i] - value))


def _violates(params: Mapping[str, Any], rules: Sequence[tuple[str, str]]) -> bool:
    """Whether a ``(low, high)`` rule is broken: ``params[high] < params[low]``."""
    for low, high in rules:
        a, b = params.get(low), params.get(high)
        if isinstance(a, int | float) and isinstance(b, int | float) and b < a:
            return True
    return False


def next_point(
    space: Sequence[Dimension],
    taken: Sequence[Taken],
    defaults: Mapping[str, Any] | None = None,
    at_least: Sequence[tuple[str, str]] = (),
) -> Proposal | None:
    """The next configuration to measure, or None where every one this search would propose
    is taken.

    ``defaults``: each dimension's value where a trial does not set it (vLLM's own), also where
    the search starts. ``at_least``: pairs ``(a, b)`` with ``b`` never below ``a`` (vLLM
    refuses max-num-batched-tokens below max-num-seqs); proposals that break one are skipped.
    """
    if not space:
        return None
    defaults = dict(defaults or {})
    ladders = [levels(d) for d in space]
    names = [d.name for d in space]

    def point_of(values: Mapping[str, Any]) -> Point | None:
        out = []
        for name in names:
            value = values.get(name, defaults.get(name))
            if value is None and name not in values and name not in defaults:
                return None
            out.append(_canonical(value))
        return tuple(out)

    seen = {p for p in (point_of(t.values) for t in taken) if p is not None}
    ranks = {i: t.rank for i, t in enumerate(taken) if t.rank is not None}
    incumbent = taken[min(ranks, key=ranks.__getitem__)] if ranks else None
    start = dict(defaults) | (dict(incumbent.values) if incumbent is not None else {})
    anchor = [
        _nearest(dim, ladder, start.get(dim.name))
        for dim, ladder in zip(space, ladders, strict=True)
    ]

    def proposal(index: Sequence[int], move: str) -> Proposal | None:
        params = {n: ladder[i] for n, ladder, i in zip(names, ladders, index, strict=True)}
        point = tuple(params[n] for n in names)
        if point in seen or _violates(params, at_least):
            return None
        return Proposal(params, move)

    lost = _lost(ladders, seen, point_of(incumbent.values) if incumbent is not None else None)
    sizes = [len(ladder) for ladder in ladders]
    passed: list[tuple[list[int], str]] = []
    here = [(list(anchor), "the incumbent's levels")]
    descending = [_descending(ladder) for ladder in ladders]
    moves = itertools.chain(here, _moves(names, sizes, anchor, lost, passed, descending))
    for index, move in moves:
        found = proposal(index, move)
        if found is not None:
            return found
    refined = _refine(space, ladders, anchor, seen, at_least)
    if refined is not None:
        return refined
    return next((p for p in itertools.starmap(proposal, passed) if p is not None), None)


def _lost(
    ladders: Sequence[Sequence[Any]], seen: set[Point], incumbent: Point | None
) -> Callable[[Sequence[int]], bool]:
    """Whether the configuration at a level index was taken and is not the ``incumbent``."""

    def lost(index: Sequence[int]) -> bool:
        point = tuple(ladder[i] for ladder, i in zip(ladders, index, strict=True))
        return point in seen and point != incumbent

    return lost


def _descending(ladder: Sequence[Any]) -> bool:
    """Whether a ladder's levels are numbers listed from the largest down."""
    numbers = [v for v in ladder if isinstance(v, int | float) and not isinstance(v, bool)]
    return len(numbers) == len(ladder) > 1 and numbers == sorted(numbers, reverse=True)


def _moves(
    names: Sequence[str],
    sizes: Sequence[int],
    anchor: Sequence[int],
    lost: Callable[[Sequence[int]], bool],
    passed: list[tuple[list[int], str]],
    descending: Sequence[bool],
) -> Iterator[tuple[list[int], str]]:
    """Level indexes around ``anchor``, in the order proposed: one dimension moved one level
    along its ladder, then one level back, each dimension in turn, then two levels, and so on
    to the ends of every dimension; then two dimensions moved one level each. A move is named
    by the values' direction: along a ladder listed from the largest down (``descending``), the
    first move is down. A one-dimension move whose two levels before it, in its direction, both
    ``lost`` is appended to ``passed`` instead of proposed, and so is every move further that
    way."""
    stopped: set[tuple[int, int]] = set()
    for distance in range(1, max(sizes)):
        for axis, name in enumerate(names):
            for sign in (1, -1):
                moved = list(anchor)
                moved[axis] += sign * distance
                if not 0 <= moved[axis] < sizes[axis]:
                    continue
                down = (sign < 0) != descending[axis]
                move = (moved, f"{name} {'down' if down else 'up'} {distance}")
                if distance > 2 and all(
                    lost([*anchor[:axis], anchor[axis] + sign * d, *anchor[axis + 1 :]])
                    for d in (distance - 1, distance - 2)
                ):
                    stopped.add((axis, sign))
                if (axis, sign) in stopped:
                    passed.append(move)
                else:
                    yield move
    for a, b in itertools.combinations(range(len(names)), 2):
        for sa, sb in itertools.product((1, -1), repeat=2):
            moved = list(anchor)
            moved[a] += sa
            moved[b] += sb
            if 0 <= moved[a] < sizes[a] and 0 <= moved[b] < sizes[b]:
                yield moved, f"{names[a]} and {names[b]} together"


def _refine(
    space: Sequence[Dimension],
    ladders: Sequence[Sequence[Any]],
    anchor: Sequence[int],
    seen: set[Point],
    at_least: Sequence[tuple[str, str]],
) -> Proposal | None:
    """Halfway between the incumbent's value and a neighbouring level, one numeric dimension
    at a time."""
    names = [d.name for d in space]
    here = [ladder[i] for ladder, i in zip(ladders, anchor, strict=True)]
    for axis, dim in enumerate(space):
        if dim.kind == "categorical":
            continue
        for neighbour in (anchor[axis] + 1, anchor[axis] - 1):
            if not 0 <= neighbour < len(ladders[axis]):
                continue
            a, b = here[axis], ladders[axis][neighbour]
            middle = math.sqrt(a * b) if dim.log and a > 0 and b > 0 else (a + b) / 2
            value = _snap(dim, middle)
            if value in (a, b):
                continue
            params = dict(zip(names, here, strict=True)) | {dim.name: value}
            if tuple(params[n] for n in names) in seen or _violates(params, at_least):
                continue
            return Proposal(params, f"{dim.name} refined to {value}")
    return None
