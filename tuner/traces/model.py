"""The request trace: arrivals and lengths, the busiest window, time scaling, clipping.

Pure: no I/O. Loading from files lives in ``tuner.traces.formats``. Arrays keep a million-row trace
small and make windowing a pair of binary searches.
"""

from __future__ import annotations

import dataclasses
import itertools
import operator
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import overload

import numpy as np

IntLists = tuple[np.ndarray, np.ndarray]
"""Lists of integers, one per row, flat: ``(values, offsets)``, row ``i`` being
``values[offsets[i]:offsets[i + 1]]``."""


def int_lists(rows: Sequence[Sequence[int]]) -> IntLists:
    """``rows`` of integers, flat; ids beyond int64 are kept exact, as Python ints."""
    offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum([len(row) for row in rows], out=offsets[1:])
    flat = list(itertools.chain.from_iterable(rows))
    try:
        return np.array(flat, dtype=np.int64), offsets
    except OverflowError:
        return np.array(flat, dtype=object), offsets


@dataclass(frozen=True, slots=True)
class Request:
    """One request to replay: when it is sent and how long its prompt and output are."""

    arrival_s: float
    input_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...] = ()


@dataclass(frozen=True, eq=False)
class HashIds(Sequence[tuple[int, ...]]):
    """One tuple of hash ids per request, stored flat: request ``i`` has
    ``ids[offsets[i]:offsets[i + 1]]``.

    A million requests of a dozen ids take about 100 MB this way, against about 1 GB as Python
    tuples of ints. Reads as a sequence of tuples, and compares equal to one with the same ids.
    ``ids`` is int64 (object only for ids beyond int64, which nothing real has).
    """

    ids: np.ndarray
    offsets: np.ndarray

    @classmethod
    def from_lists(cls, lists: Iterable[Iterable[int]]) -> HashIds:
        return cls(*int_lists([tuple(row) for row in lists]))

    @property
    def block_count(self) -> int:
        """How many ids all requests hold together."""
        return int(self.offsets[-1] - self.offsets[0])

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @overload
    def __getitem__(self, index: int) -> tuple[int, ...]: ...

    @overload
    def __getitem__(self, index: slice) -> HashIds: ...

    def __getitem__(self, index: int | slice) -> tuple[int, ...] | HashIds:
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            if step != 1:
                return self.take(np.arange(start, stop, step))
            return HashIds(self.ids, self.offsets[start : max(start, stop) + 1])
        row = operator.index(index)
        if row < 0:
            row += len(self)
        if not 0 <= row < len(self):
            raise IndexError("hash_ids index out of range")
        return tuple(self.ids[self.offsets[row] : self.offsets[row + 1]].tolist())

    def __iter__(self) -> Iterator[tuple[int, ...]]:
        flat = self.ids[self.offsets[0] : self.offsets[-1]].tolist()
        bounds = (self.offsets - self.offsets[0]).tolist()
        for start, stop in itertools.pairwise(bounds):
            yield tuple(flat[start:stop])

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence):
            return NotImplemented
        return len(self) == len(other) and all(
            isinstance(theirs, Sequence) and mine == tuple(theirs)
            for mine, theirs in zip(self, other, strict=True)
        )

    def take(self, rows: np.ndarray) -> HashIds:
        """The ids of requests ``rows`` (an index array), in that order."""
        starts = self.offsets[:-1][rows]
        counts = self.offsets[1:][rows] - starts
        offsets = np.zeros(len(counts) + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        index = np.repeat(starts - offsets[:-1], counts) + np.arange(offsets[-1])
        return HashIds(self.ids[index], offsets)


@dataclass(frozen=True, eq=False)
class Trace:
    """Requests sorted by arrival, arrivals in seconds from the first one (which is 0).

    ``hash_ids`` (optional, one tuple of ids per request) name shared prompt blocks of
    ``block_tokens`` tokens each: equal leading ids mean an equal prompt prefix.
    ``session_id`` (optional, one string per request) names the conversation a request
    belongs to, where the trace records one.
    """

    arrival_s: np.ndarray
    input_tokens: np.ndarray
    output_tokens: np.ndarray
    source: str = ""
    hash_ids: HashIds | None = None
    block_tokens: int = 0
    session_id: np.ndarray | None = None

    def __post_init__(self) -> None:
        n = len(self.arrival_s)
        if len(self.input_tokens) != n or len(self.output_tokens) != n:
            raise ValueError("trace columns differ in length")
        if self.hash_ids is not None and len(self.hash_ids) != n:
            raise ValueError("hash_ids differ in length from the trace")
        if self.session_id is not None and len(self.session_id) != n:
            raise ValueError("session_id differs in length from the trace")

    def __len__(self) -> int:
        return len(self.arrival_s)

    @property
    def span_s(self) -> float:
        return float(self.arrival_s[-1] - self.arrival_s[0]) if len(self) else 0.0

    def take(self, start: int, stop: int) -> Trace:
        """Requests ``start:stop``, arrivals rebased so the window starts at 0."""
        return self._select(slice(start, stop))

    def window(self, start_s: float, duration_s: float) -> Trace:
        """Requests arriving in ``[start_s, start_s + duration_s)``, rebased to ``start_s``."""
        lo = int(np.searchsorted(self.arrival_s, start_s, side="left"))
        hi = int(np.searchsorted(self.arrival_s, start_s + duration_s, side="left"))
        return self._select(slice(lo, hi), origin_s=start_s)

    def scaled(self, time_scale: float) -> Trace:
        """Every arrival time multiplied by ``time_scale`` (< 1 compresses, > 1 stretches)."""
        if time_scale <= 0:
            raise ValueError("time_scale must be positive")
        return dataclasses.replace(self, arrival_s=self.arrival_s * time_scale)

    def requests(self) -> list[Request]:
        hash_ids: Iterable[tuple[int, ...]] = self.hash_ids or itertools.repeat((), len(self))
        return [
            Request(float(t), int(i), int(o), h)
            for t, i, o, h in zip(
                self.arrival_s, self.input_tokens, self.output_tokens, hash_ids, strict=True
            )
        ]

    def _select(self, index: slice, origin_s: float | None = None) -> Trace:
        arrival_s = self.arrival_s[index]
        if origin_s is None:
            origin_s = float(arrival_s[0]) if len(arrival_s) else 0.0
        return dataclasses.replace(
            self,
            arrival_s=arrival_s - origin_s,
            input_tokens=self.input_tokens[index],
            output_tokens=self.output_tokens[index],
            hash_ids=None if self.hash_ids is None else self.hash_ids[index],
            session_id=None if self.session_id is None else self.session_id[index],
        )


def from_columns(
    arrival_s: np.ndarray | list[float],
    input_tokens: np.ndarray | list[int],
    output_tokens: np.ndarray | list[int],
    *,
    source: str = "",
    hash_ids: HashIds | Sequence[Sequence[int]] | None = None,
    block_tokens: int = 0,
    session_id: np.ndarray | list[str] | None = None,
) -> Trace:
    """A trace from raw columns: sorted by arrival (stable), rebased to start at 0."""
    arrival = np.asarray(arrival_s, dtype=np.float64)
    inputs = np.array(input_tokens, dtype=np.int64)  # copies: the trace owns its columns
    outputs = np.array(output_tokens, dtype=np.int64)
    sessions = None if session_id is None else np.array(session_id, dtype=str)
    ids = hash_ids
    if ids is not None and not isinstance(ids, HashIds):
        ids = HashIds.from_lists(ids)
    if not np.all(arrival[1:] >= arrival[:-1]):  # sorted input (the usual case) is kept as is
        order = np.argsort(arrival, kind="stable")
        arrival, inputs, outputs = arrival[order], inputs[order], outputs[order]
        sessions = None if sessions is None else sessions[order]
        ids = None if ids is None else ids.take(order)
    if len(arrival):
        arrival = arrival - arrival[0]
    return Trace(
        arrival_s=arrival,
        input_tokens=inputs,
        output_tokens=outputs,
        source=source,
        hash_ids=ids,
        block_tokens=block_tokens,
        session_id=sessions,
    )


def busiest_window_start(trace: Trace, window_s: float) -> float:
    """Start of the ``window_s``-second window holding the most arrivals (earliest on ties).

    Every maximal window can be slid right until its first arrival is a request's arrival, so
    only windows starting at an arrival need checking.
    """
    if not len(trace):
        return 0.0
    ends = np.searchsorted(trace.arrival_s, trace.arrival_s + window_s, side="left")
    counts = ends - np.arange(len(trace))
    return float(trace.arrival_s[int(np.argmax(counts))])


def busiest_window(trace: Trace, window_s: float) -> tuple[float, Trace]:
    """The busiest ``window_s`` seconds of ``trace``: its start in trace time, and its requests."""
    if window_s >= trace.span_s:
        return 0.0, trace
    start_s = busiest_window_start(trace, window_s)
    return start_s, trace.window(start_s, window_s)


@dataclass(frozen=True)
class Clipping:
    """How many requests had to be shortened to fit the model's context."""

    inputs_clipped: int
    outputs_clipped: int


def clip_to_context(trace: Trace, max_model_len: int) -> tuple[Trace, Clipping]:
    """Shorten lengths so that prompt plus output fits ``max_model_len`` tokens.

    The output length is kept where possible (it drives decode time); the prompt is clipped
    first, down to one token, and only then the output.
    """
    if max_model_len < 2:
        raise ValueError("max_model_len must be at least 2")
    outputs = np.minimum(trace.output_tokens, max_model_len - 1)
    inputs = np.minimum(trace.input_tokens, max_model_len - outputs)
    clipping = Clipping(
        inputs_clipped=int(np.count_nonzero(inputs < trace.input_tokens)),
        outputs_clipped=int(np.count_nonzero(outputs < trace.output_tokens)),
    )
    return dataclasses.replace(trace, input_tokens=inputs, output_tokens=outputs), clipping
