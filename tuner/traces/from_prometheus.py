"""A trace rebuilt from a production vLLM's metrics in Prometheus.

Prometheus keeps no per-request rows, only counters, histograms and gauges; this module turns
them back into a request trace with the same rate over time and the same length distributions:

- arrivals: the rate per step of the count of first tokens (``_count`` of the
  ``vllm:time_to_first_token_seconds`` histogram; from the counter's values at each step, see
  ``rate_from_counters``), as a whole number of requests per step (cumulative rounding keeps
  the total), placed uniformly at random in their step and moved back by that step's mean
  TTFT (the counter counts first tokens, not arrivals; the histogram's ``_sum`` and
  ``_count`` grow together as each first token is recorded, so their increase over a step is
  the mean TTFT of the requests counted there; a server that falls behind has TTFTs growing
  over seconds, which one mean over the range would misplace). Where Prometheus has no TTFT
  histogram, the rate of ``vllm:request_success_total`` moved back by each step's mean
  end-to-end latency instead: completions lag arrivals by a whole request's time, which
  spreads as requests queue, while a first token lags by its queueing and prefill only;
- lengths: drawn from the increase of the ``vllm:request_prompt_tokens`` and
  ``vllm:request_generation_tokens`` histograms over the whole range; inside a bucket, values
  follow ``lo + (hi - lo) * u**a`` with ``a`` chosen so that the mean equals the histogram's
  exact ``_sum / _count``;
- concurrency: ``vllm:num_requests_running`` averaged over each step (every scrape counts,
  not one sample per step), stamped at the step's start.

What Prometheus cannot say is not invented: prompt and output lengths are drawn independently
of each other and of time, and nothing is known of prefix sharing.

``rebuild`` is pure; ``write_*`` write files; the queries live in ``tuner.traces.prometheus``.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from tuner.errors import TunerError
from tuner.traces.model import Trace, from_columns

logger = logging.getLogger(__name__)

SUCCESS = "vllm:request_success_total"
PROMPT = "vllm:request_prompt_tokens"
GENERATION = "vllm:request_generation_tokens"
RUNNING = "vllm:num_requests_running"
E2E = "vllm:e2e_request_latency_seconds"
TTFT = "vllm:time_to_first_token_seconds"
FIRST_TOKENS = f"{TTFT}_count"

# The counters arrivals are rebuilt from, first choice first, each with the histogram whose
# mean is its lag behind a request's arrival, as the header names that lag.
ARRIVAL_COUNTERS: dict[str, tuple[str, str]] = {
    FIRST_TOKENS: (TTFT, "TTFT"),
    SUCCESS: (E2E, "e2e latency"),
}


@dataclass(frozen=True)
class LengthHistogram:
    """Cumulative bucket counts over a range: ``upper_bounds`` ascending, the last may be inf."""

    upper_bounds: np.ndarray
    cumulative: np.ndarray
    sum: float
    count: float

    @property
    def mean(self) -> float:
        return self.sum / self.count if self.count > 0 else math.nan


@dataclass(frozen=True)
class Scraped:
    """What the queries returned, times in seconds since the epoch."""

    start_s: float
    end_s: float
    step_s: float
    rate_times_s: np.ndarray
    rate_per_s: np.ndarray
    prompt: LengthHistogram
    generation: LengthHistogram
    running_times_s: np.ndarray
    running: np.ndarray
    # The mean time from a request's arrival to its count in ``counter``, whose rate per step
    # is ``rate_per_s``: one of ``ARRIVAL_COUNTERS``. ``lag_s``: that mean for the requests
    # counted in each step (NaN where none were; empty: ``mean_lag_s`` for every step).
    mean_lag_s: float
    counter: str = FIRST_TOKENS
    lag_s: np.ndarray = field(default_factory=lambda: np.zeros(0))


@dataclass(frozen=True)
class Rebuilt:
    """The rebuilt trace (time 0 is ``origin_s``, epoch seconds) and concurrency series
    (seconds from the range's start)."""

    trace: Trace
    origin_s: float
    concurrency_times_s: np.ndarray
    concurrency: np.ndarray
    header: tuple[str, ...]


# --- pure --------------------------------------------------------------------------------


def _bucket_edges(histogram: LengthHistogram) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(lower, upper, count)`` per bucket; the ``+Inf`` bucket is closed at twice its lower."""
    upper = histogram.upper_bounds.astype(np.float64)
    counts = np.diff(np.concatenate(([0.0], histogram.cumulative)))
    counts = np.clip(counts, 0.0, None)
    lower = np.concatenate(([0.0], upper[:-1]))
    upper = np.where(np.isinf(upper), np.maximum(lower * 2, lower + 1), upper)
    return lower, upper, counts


def sample_lengths(histogram: LengthHistogram, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` whole lengths ≥ 1 with ``histogram``'s bucket shares and mean, in random order.

    Stratified rather than random: each bucket gets its share of ``n`` (largest remainder),
    and its values sit at evenly spaced quantiles of ``lo + (hi - lo) * u**a``, so a few
    hundred requests already have the histogram's percentiles and mean.
    """
    lower, upper, counts = _bucket_edges(histogram)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    if counts.sum() <= 0:
        raise TunerError("the length histogram is empty over the range")
    weights = counts / counts.sum()
    spread = float(np.sum(weights * (upper - lower)))
    base = float(np.sum(weights * lower))
    # Mean of lo + (hi - lo) * u**a is lo + (hi - lo) / (a + 1): solve for the exact mean.
    fraction = 0.5
    if spread > 0 and math.isfinite(histogram.mean):
        fraction = min(max((histogram.mean - base) / spread, 0.02), 0.98)
    a = 1.0 / fraction - 1.0
    shares = weights * n
    per_bucket = np.floor(shares).astype(np.int64)
    short = n - int(per_bucket.sum())
    per_bucket[np.argsort(per_bucket - shares, kind="stable")[:short]] += 1
    values = []
    for lo, hi, m in zip(lower, upper, per_bucket, strict=True):
        u = ((np.arange(m) + 0.5) / m) ** a
        values.append(np.clip(np.rint(lo + (hi - lo) * u), np.floor(lo) + 1, hi))
    return rng.permutation(np.concatenate(values)).astype(np.int64)


def arrivals_from_rate(
    times_s: np.ndarray, rate_per_s: np.ndarray, step_s: float, rng: np.random.Generator
) -> np.ndarray:
    """Arrival times: a whole number per step, uniform within it.

    The first rate sample at ``t`` covers ``(t - step_s, t]``, each later one the time since
    the sample before it (the last step of a range may be shorter than ``step_s``). Rounding
    the running total (not each step) keeps the number of requests equal to the integral of
    the rate.
    """
    times_s = np.asarray(times_s, dtype=np.float64)
    if not len(times_s):
        return np.zeros(0)
    starts = np.concatenate(([times_s[0] - step_s], times_s[:-1]))
    widths = times_s - starts
    expected = np.nan_to_num(np.clip(rate_per_s, 0.0, None)) * widths
    cumulative = np.rint(np.cumsum(expected)).astype(np.int64)
    per_step = np.diff(np.concatenate(([0], cumulative)))
    offsets = rng.random(int(per_step.sum())) * np.repeat(widths, per_step)
    return np.sort(np.repeat(starts, per_step) + offsets)


def _shift_s(scraped: Scraped, counted_s: np.ndarray) -> np.ndarray:
    """How far back each counted time moves: its step's mean lag, else the range's."""
    overall = scraped.mean_lag_s if math.isfinite(scraped.mean_lag_s) else 0.0
    if len(scraped.lag_s) != len(scraped.rate_times_s):
        return np.full(len(counted_s), overall)
    per_step = np.where(np.isfinite(scraped.lag_s), scraped.lag_s, overall)
    # arrivals_from_rate puts a step's counts in [previous grid time, its grid time).
    step = np.searchsorted(scraped.rate_times_s, counted_s, side="right")
    return per_step[np.minimum(step, len(per_step) - 1)]


def rebuild(scraped: Scraped, seed: int = 0) -> Rebuilt:
    """The request trace and concurrency series the scraped metrics describe."""
    rng = np.random.default_rng(seed)
    counted_s = arrivals_from_rate(scraped.rate_times_s, scraped.rate_per_s, scraped.step_s, rng)
    shift_s = _shift_s(scraped, counted_s)
    arrival_s = np.clip(counted_s - shift_s - scraped.start_s, 0.0, None)
    if not len(arrival_s):
        raise TunerError(f"no requests in {scraped.counter} over the range; nothing to rebuild")
    inputs = sample_lengths(scraped.prompt, len(arrival_s), rng)
    outputs = sample_lengths(scraped.generation, len(arrival_s), rng)
    trace = from_columns(arrival_s, inputs, outputs, source="prometheus")
    header = (
        f"rebuilt by tuner from Prometheus metrics of vLLM, "
        f"{_iso(scraped.start_s)} to {_iso(scraped.end_s)}, step {scraped.step_s:g} s, seed {seed}",
        f"arrivals: rate of {scraped.counter} per {scraped.step_s:g} s step, uniform within a "
        f"step, shifted back by {_shift_text(scraped, shift_s)}",
        f"lengths: drawn from the {PROMPT} and {GENERATION} histograms over the range "
        f"(means {scraped.prompt.mean:.1f} and {scraped.generation.mean:.1f} tokens), "
        "independently of each other and of time",
        f"timestamps: seconds from {_iso(scraped.start_s + float(arrival_s.min()))}; "
        f"{len(trace)} requests",
    )
    return Rebuilt(
        trace=trace,
        origin_s=scraped.start_s + float(arrival_s.min()),
        concurrency_times_s=scraped.running_times_s - scraped.step_s - scraped.start_s,
        concurrency=scraped.running,
        header=header,
    )


def _shift_text(scraped: Scraped, shift_s: np.ndarray) -> str:
    lag = ARRIVAL_COUNTERS[scraped.counter][1]
    if len(scraped.lag_s) != len(scraped.rate_times_s) or np.ptp(shift_s) == 0:
        return f"the mean {lag} {float(shift_s[0]):.3f} s"
    return (
        f"each step's mean {lag} ({float(shift_s.min()):.3f} to {float(shift_s.max()):.3f} s; "
        f"{scraped.mean_lag_s:.3f} s over the range)"
    )


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, tz=UTC).isoformat(timespec="seconds")


# --- files -------------------------------------------------------------------------------


def write_trace(path: Path, rebuilt: Rebuilt) -> None:
    """The canonical CSV, with ``#`` lines on top saying how it was derived."""
    trace = rebuilt.trace
    lines = [f"# {line}" for line in rebuilt.header]
    lines.append("timestamp,input_tokens,output_tokens")
    lines += [
        f"{t:.3f},{i},{o}"
        for t, i, o in zip(
            trace.arrival_s.tolist(),
            trace.input_tokens.tolist(),
            trace.output_tokens.tolist(),
            strict=True,
        )
    ]
    path.write_text("\n".join(lines) + "\n")


def write_concurrency(path: Path, rebuilt: Rebuilt) -> None:
    """``timestamp,concurrency`` of ``vllm:num_requests_running``, seconds from the start."""
    lines = [f"# {rebuilt.header[0]}", f"# concurrency: sum({RUNNING}), mean of each step"]
    lines.append("timestamp,concurrency")
    lines += [
        f"{t:.3f},{c:g}"
        for t, c in zip(
            rebuilt.concurrency_times_s.tolist(), rebuilt.concurrency.tolist(), strict=True
        )
    ]
    path.write_text("\n".join(lines) + "\n")
