"""Concurrency traces: how many requests production kept in flight, over time.

A CSV ``timestamp,concurrency`` (what ``vllm:num_requests_running`` exports to) is replayed
closed-loop: ``tuner.load.closed_loop.replay_closed_loop`` keeps ``target_at(t)`` requests in
flight.
Request lengths come, seeded, from a request trace or from given distributions; the ``i``-th
request sent has the same lengths in every trial.

Pure apart from reading the CSV it is given.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tuner.errors import InputError, TraceError
from tuner.traces.csv_reader import read_csv
from tuner.traces.model import Request, Trace
from tuner.traces.source import MAX_TRACE_BYTES, TraceText, as_source
from tuner.traces.table import Kind, timestamps

logger = logging.getLogger(__name__)

MAX_CONCURRENCY = 100_000


@dataclass(frozen=True, eq=False)
class ConcurrencyTrace:
    """A step function: ``concurrency[i]`` requests in flight from ``time_s[i]`` on.

    Times are seconds from the first sample (which is 0); the last sample holds until
    ``end_s``, one typical sampling interval later.
    """

    time_s: np.ndarray
    concurrency: np.ndarray
    end_s: float
    source: str = ""

    @property
    def span_s(self) -> float:
        return self.end_s

    def target_at(self, t_s: float) -> int:
        """Requests to keep in flight at ``t_s`` (0 outside the trace)."""
        if t_s < 0 or t_s >= self.end_s:
            return 0
        index = int(np.searchsorted(self.time_s, t_s, side="right")) - 1
        return int(self.concurrency[index])

    def next_change_s(self, t_s: float) -> float:
        """The first sample time after ``t_s``, or ``end_s``."""
        index = int(np.searchsorted(self.time_s, t_s, side="right"))
        return float(self.time_s[index]) if index < len(self.time_s) else self.end_s

    def window(self, start_s: float, duration_s: float) -> ConcurrencyTrace:
        """The schedule over ``[start_s, start_s + duration_s)``, rebased to ``start_s``."""
        end_s = min(start_s + duration_s, self.end_s)
        first = max(int(np.searchsorted(self.time_s, start_s, side="right")) - 1, 0)
        last = int(np.searchsorted(self.time_s, end_s, side="left"))
        times = np.maximum(self.time_s[first:last] - start_s, 0.0)
        return dataclasses.replace(
            self,
            time_s=times,
            concurrency=self.concurrency[first:last],
            end_s=max(end_s - start_s, 0.0),
        )

    def scaled(self, time_scale: float) -> ConcurrencyTrace:
        if time_scale <= 0:
            raise ValueError("time_scale must be positive")
        return dataclasses.replace(
            self, time_s=self.time_s * time_scale, end_s=self.end_s * time_scale
        )


def busiest_window_start(trace: ConcurrencyTrace, window_s: float) -> float:
    """Start of the ``window_s`` seconds with the most request-seconds in flight.

    The integral of a step function over a sliding window is piecewise linear in the
    window's start, so its maximum is at a start or an end aligned with a sample time.
    """
    if window_s >= trace.end_s:
        return 0.0
    edges = np.append(trace.time_s, trace.end_s)
    area = np.concatenate(([0.0], np.cumsum(trace.concurrency * np.diff(edges))))

    def integral(t: np.ndarray) -> np.ndarray:
        index = np.clip(np.searchsorted(edges, t, side="right") - 1, 0, len(trace.time_s) - 1)
        return area[index] + trace.concurrency[index] * (t - edges[index])

    starts = np.concatenate((trace.time_s, trace.time_s - window_s + 0.0, edges - window_s))
    starts = np.unique(np.clip(starts, 0.0, trace.end_s - window_s))
    totals = integral(starts + window_s) - integral(starts)
    return float(starts[int(np.argmax(totals))])


def from_samples(
    time_s: np.ndarray | list[float], concurrency: np.ndarray | list[float], source: str = ""
) -> ConcurrencyTrace:
    """Samples sorted by time and rebased to 0; the last one held for the median interval."""
    times = np.asarray(time_s, dtype=np.float64)
    order = np.argsort(times, kind="stable")
    times = times[order] - times[order][0]
    values = np.rint(np.asarray(concurrency, dtype=np.float64)[order]).astype(np.int64)
    hold_s = float(np.median(np.diff(times))) if len(times) > 1 else 1.0
    return ConcurrencyTrace(times, values, float(times[-1]) + hold_s, source)


def load_concurrency(
    source: TraceText | str | Path, max_bytes: int = MAX_TRACE_BYTES
) -> ConcurrencyTrace:
    """Read ``timestamp,concurrency`` (seconds or ISO datetimes; whole or fractional counts).

    Fractional counts (averaged exports) are rounded; out-of-order rows are sorted with a
    warning; two rows at one time, negative or non-finite counts or timestamps are errors.
    """
    source = as_source(source, max_bytes)
    path = source.name
    wanted: dict[str, Kind] = {"timestamp": "time", "concurrency": "number"}
    table = read_csv(path, source.text, wanted)
    values = table.columns["concurrency"]
    bad = ~np.isfinite(values) | (values < 0) | (values > MAX_CONCURRENCY)
    if np.any(bad):
        row = int(np.argmax(bad))
        table.fail(row, f"concurrency must be between 0 and {MAX_CONCURRENCY}, got {values[row]}")
    times = timestamps(table, "timestamp")
    order = np.argsort(times, kind="stable")
    if np.any(order != np.arange(len(order))):
        logger.warning("%s: samples out of time order; sorted", path)
    repeated = np.flatnonzero(np.diff(times[order]) == 0)
    if len(repeated):
        table.fail(int(order[repeated[0] + 1]), "two samples at the same timestamp")
    if np.all(np.rint(values) == 0):
        raise TraceError(path, None, "the concurrency is 0 throughout; nothing to replay")
    return from_samples(times, values, path)


@dataclass(frozen=True)
class LengthSource:
    """Pairs of (input, output) lengths to draw from, with replacement, keeping pairs."""

    input_tokens: np.ndarray
    output_tokens: np.ndarray

    @classmethod
    def from_trace(cls, trace: Trace) -> LengthSource:
        if not len(trace):
            raise InputError("the length trace has no requests")
        return cls(trace.input_tokens, trace.output_tokens)

    @classmethod
    def from_distributions(
        cls, input_spec: str, output_spec: str, seed: int = 0, size: int = 10_000
    ) -> LengthSource:
        rng = np.random.default_rng([seed, 17])
        return cls(
            draw_distribution(input_spec, size, rng), draw_distribution(output_spec, size, rng)
        )


def draw_distribution(spec: str, size: int, rng: np.random.Generator) -> np.ndarray:
    """``fixed:N``, ``uniform:LO:HI`` or ``lognormal:MEDIAN:SIGMA`` as whole lengths ≥ 1."""
    name, *raw = spec.split(":")
    try:
        params = [float(p) for p in raw]
    except ValueError:
        raise InputError(f"bad length distribution {spec!r}: parameters must be numbers") from None
    shapes = {"fixed": 1, "uniform": 2, "lognormal": 2}
    if name not in shapes or len(params) != shapes[name]:
        raise InputError(
            f"bad length distribution {spec!r}; "
            "use fixed:N, uniform:LO:HI or lognormal:MEDIAN:SIGMA"
        )
    if not all(math.isfinite(p) and p > 0 for p in params):
        raise InputError(f"bad length distribution {spec!r}: parameters must be positive")
    if name == "fixed":
        values = np.full(size, params[0])
    elif name == "uniform":
        low, high = params
        if high < low:
            raise InputError(f"bad length distribution {spec!r}: HI < LO")
        values = rng.uniform(low, high + 1, size)
    else:
        values = rng.lognormal(math.log(params[0]), params[1], size)
    return np.maximum(np.floor(values), 1).astype(np.int64)


_CHUNK = 1024


def closed_loop_requests(
    lengths: LengthSource, seed: int = 0, max_model_len: int | None = None
) -> Iterator[Request]:
    """An endless, seeded stream of requests (arrival 0: the replay stamps the send time).

    Request ``i`` has the same lengths in every trial, however fast the server drains them.
    Lengths are clipped to ``max_model_len`` as ``tuner.traces.model.clip_to_context`` does.
    """
    pool = len(lengths.input_tokens)
    for number in itertools.count():
        picks = np.random.default_rng([seed, 23, number]).integers(0, pool, _CHUNK)
        for pick in picks:
            n_in, n_out = int(lengths.input_tokens[pick]), int(lengths.output_tokens[pick])
            if max_model_len is not None:
                n_out = min(n_out, max_model_len - 1)
                n_in = min(n_in, max_model_len - n_out)
            yield Request(0.0, n_in, n_out)


@dataclass(frozen=True)
class ClosedLoopPlan:
    """A closed-loop workload: keep ``schedule`` in flight with requests drawn from ``lengths``."""

    schedule: ConcurrencyTrace
    lengths: LengthSource
    max_model_len: int | None = None

    def requests(self, seed: int) -> Iterator[Request]:
        """A fresh stream: every trial that calls this replays the same requests."""
        return closed_loop_requests(self.lengths, seed, self.max_model_len)
