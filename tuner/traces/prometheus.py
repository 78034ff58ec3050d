"""Querying Prometheus for what ``tuner.traces.from_prometheus`` rebuilds a trace from.

``fetch`` is the only network I/O of the trace stage: queries of Prometheus' HTTP API
(``/api/v1/query_range`` and ``/api/v1/query``, sent by ``tuner.traces.prometheus_http``)
for the count of first tokens (else of finished requests) over the range, the running-requests
gauge averaged per step, and the increase over the whole range of the prompt and generation
histograms and of the histogram whose mean is that count's lag (TTFT, else end-to-end
latency). Credentials and TLS trust come in an ``Access``; certificates are verified unless it
says ``insecure``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from tuner.errors import InputError, TunerError
from tuner.traces.from_prometheus import (
    ARRIVAL_COUNTERS,
    GENERATION,
    PROMPT,
    RUNNING,
    LengthHistogram,
    Scraped,
)
from tuner.traces.prometheus_http import Access, Connection, Result
from tuner.traces.table import parse_timestamp
from tuner.urls import shown_url

logger = logging.getLogger(__name__)

OPEN = Access()
"""No credentials, the system's CAs."""

Query = Callable[[str, float], Result]
"""An instant query: PromQL evaluated at a time in epoch seconds."""


def _selector(selector: str) -> str:
    selector = selector.strip()
    if selector and not (selector.startswith("{") and selector.endswith("}")):
        selector = "{" + selector + "}"
    return selector


def parse_time(text: str) -> float:
    """Seconds since the epoch, from a finite number or an ISO 8601 datetime (naive is UTC)."""
    try:
        return parse_timestamp(text)
    except ValueError:
        raise InputError(f"not a time: {text!r} (use epoch seconds or ISO 8601)") from None


def rate_from_counters(
    series: Sequence[Sequence[tuple[float, float]]], step_s: float
) -> tuple[np.ndarray, np.ndarray]:
    """Requests per second in each step, from counter samples on a grid ``step_s`` apart
    (the last point may be closer: the range's end).

    The same quantity as ``sum(rate(counter[step]))``, without its loss: back-to-back
    ``rate()`` windows each see only the scrapes inside them, drop the increments between
    one window's last scrape and the next one's first, and extrapolate to make up for it;
    at 1 request per second and 5 s steps that lost a third of the requests in our tests.
    Differences of the counter between grid points lose nothing. A drop is a counter reset
    (a restarted server): the new value is the increase. A series that appears mid-range
    starts from 0.
    """
    grid = sorted({t for samples in series for t, _ in samples})
    if len(grid) < 2:
        return np.zeros(0), np.zeros(0)
    position = {t: i for i, t in enumerate(grid)}
    total = np.zeros(len(grid) - 1)
    for samples in series:
        values = np.full(len(grid), np.nan)
        for t, v in samples:
            values[position[t]] = v
        first = int(np.argmax(~np.isnan(values)))
        values[:first] = 0.0
        for i in range(1, len(values)):  # a gap (no sample in the look-back) holds the value
            if np.isnan(values[i]):
                values[i] = values[i - 1]
        steps = np.diff(values)
        total += np.where(steps < 0, values[1:], steps)
    return np.asarray(grid[1:], dtype=np.float64), total / np.diff(grid)


def _mean_per_step(sums: Result, counts: Result, times_s: np.ndarray, step_s: float) -> np.ndarray:
    """A histogram's mean over each step ending at ``times_s`` (NaN where nothing was
    observed), from its ``_sum`` and ``_count`` counters' range queries."""
    mean = np.full(len(times_s), np.nan)
    sum_times, sum_rate = rate_from_counters(_samples(sums), step_s)
    count_times, count_rate = rate_from_counters(_samples(counts), step_s)
    if not np.array_equal(sum_times, count_times):
        return mean
    at = {float(t): i for i, t in enumerate(times_s)}
    for t, total, n in zip(sum_times, sum_rate, count_rate, strict=True):
        if n > 0 and float(t) in at:
            mean[at[float(t)]] = total / n
    return mean


def _samples(result: Result) -> list[list[tuple[float, float]]]:
    return [[(float(t), float(v)) for t, v in series["values"]] for series in result]


def _values(result: Sequence[Mapping[str, Any]]) -> tuple[np.ndarray, np.ndarray]:
    if not result:
        return np.zeros(0), np.zeros(0)
    pairs = result[0]["values"]
    times = np.array([float(t) for t, _ in pairs], dtype=np.float64)
    values = np.array([float(v) for _, v in pairs], dtype=np.float64)
    return times, values


def _instant(result: Sequence[Mapping[str, Any]]) -> float:
    return float(result[0]["value"][1]) if result else math.nan


def _histogram(
    query: Query, name: str, selector: str, range_s: int, at_s: float
) -> LengthHistogram:
    buckets = query(f"sum by (le) (increase({name}_bucket{selector}[{range_s}s]))", at_s)
    if not buckets:
        raise TunerError(f"Prometheus has no {name} histogram in the range")
    pairs = sorted((float(item["metric"]["le"]), float(item["value"][1])) for item in buckets)
    total = query(f"sum(increase({name}_sum{selector}[{range_s}s]))", at_s)
    count = query(f"sum(increase({name}_count{selector}[{range_s}s]))", at_s)
    return LengthHistogram(
        upper_bounds=np.array([p[0] for p in pairs]),
        cumulative=np.maximum.accumulate(np.array([p[1] for p in pairs])),
        sum=_instant(total),
        count=_instant(count),
    )


def _close_range(series: Result, at_end: Result, end_s: float) -> Result:
    """``series`` (a range query's) with each one's instant value at ``end_s`` appended where
    the grid stops short of it; series are matched on their labels."""
    final = {frozenset(item["metric"].items()): item["value"] for item in at_end}
    closed: Result = []
    for item in series:
        values = list(item["values"])
        last = final.get(frozenset(item["metric"].items()))
        if last is not None and float(last[0]) > float(values[-1][0]):
            values.append(last)
        closed.append({**item, "values": values})
    return closed


def _check_range(url: str, start_s: float, end_s: float, step_s: float) -> None:
    """Refuse a range of less than two steps, a step that is not positive and a URL that is
    not http(s) or names no host (``InputError``)."""
    if end_s <= start_s + step_s:
        raise InputError("--end must be more than one step after --start")
    if step_s <= 0:
        raise InputError("--step-s must be positive")
    if not url.startswith(("http://", "https://")):
        raise InputError(f"--url {shown_url(url)!r} must start with http:// or https://")
    if not urlsplit(url).hostname:
        raise InputError(f"--url {shown_url(url)!r} names no host")


def _closed_series(
    prometheus: Connection, query: str, start_s: float, end_s: float, step: str
) -> Result:
    """A range query's series, each closed by its value at the range's end: the grid stops at
    the last whole step, and without that value up to a step of counts at the end (a server
    draining its queue) is lost."""
    return _close_range(
        prometheus.query_range(query, start_s, end_s, step), prometheus.query(query, end_s), end_s
    )


def _arrival_rates(counters: Result, step_s: float, selector: str) -> tuple[np.ndarray, np.ndarray]:
    """Arrivals a second at each step from the counters' series (``TunerError`` where none)."""
    rate_times_s, rate_per_s = rate_from_counters(_samples(counters), step_s)
    if not len(rate_times_s):
        names = " or ".join(ARRIVAL_COUNTERS)
        raise TunerError(f"Prometheus has no {names} series for {selector or 'any target'}")
    return rate_times_s, rate_per_s


def fetch(
    url: str,
    start_s: float,
    end_s: float,
    step_s: float,
    selector: str = "",
    *,
    access: Access = OPEN,
) -> Scraped:
    """Query Prometheus at ``url`` for the range; the only network I/O of this module.

    ``access`` gives the credentials and the TLS trust (by default none, and the system's
    CAs). Raises ``InputError`` for a bad range, URL or a query Prometheus refuses, and
    ``TunerError`` for a server that cannot be reached or verified, refuses the credentials,
    or answers without the API's JSON.
    """
    _check_range(url, start_s, end_s, step_s)
    url = url.rstrip("/")
    selector = _selector(selector)
    range_s = max(math.ceil(end_s - start_s), 1)
    step = f"{step_s:g}s"
    with Connection(url, access) as prometheus:
        for counter in ARRIVAL_COUNTERS:
            counters = prometheus.query_range(f"{counter}{selector}", start_s, end_s, step)
            if counters:
                break
        lag = ARRIVAL_COUNTERS[counter][0]
        counters = _close_range(counters, prometheus.query(f"{counter}{selector}", end_s), end_s)
        running = prometheus.query_range(
            f"sum(avg_over_time({RUNNING}{selector}[{step}]))", start_s + step_s, end_s, step
        )
        query = prometheus.query
        prompt = _histogram(query, PROMPT, selector, range_s, end_s)
        generation = _histogram(query, GENERATION, selector, range_s, end_s)
        lag_sum = query(f"sum(increase({lag}_sum{selector}[{range_s}s]))", end_s)
        lag_count = query(f"sum(increase({lag}_count{selector}[{range_s}s]))", end_s)
        lag_sums, lag_counts = (
            _closed_series(prometheus, f"{lag}_{part}{selector}", start_s, end_s, step)
            for part in ("sum", "count")
        )
    rate_times_s, rate_per_s = _arrival_rates(counters, step_s, selector)
    running_times_s, running_values = _values(running)
    mean_lag_s = _instant(lag_sum) / _instant(lag_count) if lag_count else math.nan
    lag_s = _mean_per_step(lag_sums, lag_counts, rate_times_s, step_s)
    logger.info("fetched %d rate steps of %s from %s", len(rate_times_s), counter, shown_url(url))
    return Scraped(
        start_s=start_s,
        end_s=end_s,
        step_s=step_s,
        rate_times_s=rate_times_s,
        rate_per_s=rate_per_s,
        prompt=prompt,
        generation=generation,
        running_times_s=running_times_s,
        running=running_values,
        mean_lag_s=mean_lag_s,
        counter=counter,
        lag_s=lag_s,
    )
