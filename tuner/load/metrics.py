"""Measurements of one replay: client-side request timings and vLLM's own ``/metrics``.

Pure: parses and summarises what a replay (``tuner.load.session``) collected, a ``ReplayResult``,
into its figures (``replay_figures``). Names carry units: ``_s`` for seconds, ``_per_s`` for
rates, ``_tokens`` for counts.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from tuner.traces.profile import in_flight, time_weighted

QUANTILES = (50, 95, 99)
# Whether the server's ``/metrics`` showed vLLM's metrics around the window (1) or not (0).
SERVER_METRICS = "server_metrics"


@dataclass(frozen=True, slots=True)
class RequestResult:
    """One replayed request as the client saw it; times in seconds from the replay's start."""

    scheduled_s: float
    sent_s: float
    input_tokens: int
    output_tokens: int
    ttft_s: float | None = None
    e2e_s: float | None = None
    tokens_received: int = 0
    error: str | None = None
    # When the request's bytes were written (None where the transport does not tell): on a
    # client short of CPU, later than ``sent_s``.
    written_s: float | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.e2e_s is not None

    @property
    def tpot_s(self) -> float | None:
        """Decode time per output token after the first one."""
        if not self.ok or self.ttft_s is None or self.output_tokens < 2:
            return None
        assert self.e2e_s is not None
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)


@dataclass(slots=True)
class LiveRequest:
    """What is known of a request while the window runs; times in seconds from its start.

    ``sent_s`` is the scheduled time until the request's task runs, then the time it was sent
    (``sent`` True): on a busy client the two differ, and the final figures count from the
    second. ``done_s`` is set only for a request that succeeded; one that failed stays not done.
    """

    sent_s: float
    first_token_s: float | None = None
    done_s: float | None = None
    sent: bool = False
    # When the window's schedule has it sent, which ``sent_s`` moves from once it is.
    scheduled_s: float = 0.0
    # The output tokens it asks for: once it is done, its TPOT is known for good.
    output_tokens: int = 0
    # Its prompt's tokens, and the output tokens received so far.
    input_tokens: int = 0
    tokens: int = 0

    @property
    def tpot_s(self) -> float | None:
        """Its decode time per output token after the first, once done (None before, or where it
        asks for fewer than two tokens): what its final figures will say."""
        if self.done_s is None or self.first_token_s is None or self.output_tokens < 2:
            return None
        return (self.done_s - self.first_token_s) / (self.output_tokens - 1)


@dataclass
class ReplayResult:
    """What one replay saw: per-request results and the raw ``/metrics`` texts."""

    results: list[RequestResult]
    duration_s: float
    metrics_before: str = ""
    metrics_after: str = ""
    metrics_during: list[str] = field(default_factory=list)
    stopped_at_s: float | None = None
    live: list[LiveRequest] = field(default_factory=list)
    # How far the system's wall clock moved against the monotonic one over the window
    # (``tuner.load.observe.Observed.wall_clock_step_s``).
    wall_clock_step_s: float = 0.0
    # How late tuner's own event loop woke for a timer during the window: the worst, and the 99th
    # percentile. tuner's latencies include up to this much of its own delay.
    client_lag_max_s: float = 0.0
    client_lag_p99_s: float = 0.0
    # The CPU each client process spent over the window, in cores (CPU seconds per second).
    client_cpu: tuple[float, ...] = ()


def replay_figures(result: ReplayResult) -> dict[str, float]:
    """Everything a whole replay measured: tuner's figures, vLLM's over the window, the gauges,
    and how far the wall clock and tuner's own loop were off."""
    figures = summarize_client(result.results, result.duration_s)
    before, after = parse_scrape(result.metrics_before), parse_scrape(result.metrics_after)
    # 0 where the server showed no vLLM metrics (an app that does not expose them): the
    # window's figures are then the client's alone.
    figures[SERVER_METRICS] = float(bool(before.values or after.values))
    figures |= summarize_server(before, after)
    figures |= summarize_gauges([parse_scrape(text) for text in result.metrics_during])
    figures["wall_clock_step_s"] = result.wall_clock_step_s
    return figures | client_figures(result)


def client_figures(result: ReplayResult) -> dict[str, float]:
    """The client's own figures of a window: processes, CPU of the busiest, and how late the
    requests' bytes were written against their schedule (``write_lag``), and the mean gap between
    the requests' scheduled times (``arrival_gap_mean_s``), against which a late send is weighed
    (``tuner.load.health.send_tolerance_s``)."""
    lags = [r.written_s - r.scheduled_s for r in result.results if r.written_s is not None]
    figures = {
        "client_procs": float(max(1, len(result.client_cpu))),
        "client_cpu_max": max(result.client_cpu, default=0.0),
        "client_lag_max_s": result.client_lag_max_s,
        "client_lag_p99_s": result.client_lag_p99_s,
    }
    if lags:
        figures["write_lag_p50_s"] = float(np.percentile(lags, 50))
        figures["write_lag_p99_s"] = float(np.percentile(lags, 99))
    if len(result.results) >= 2:
        scheduled = [r.scheduled_s for r in result.results]
        figures["arrival_gap_mean_s"] = (max(scheduled) - min(scheduled)) / (len(scheduled) - 1)
    return figures


def provisional(now_s: float, live: Sequence[LiveRequest]) -> dict[str, float]:
    """TTFT and end-to-end figures so far, a request still waiting counting with its wait so far.

    A request that failed counts as still waiting (for its first token if it had none), so that
    at the replay's end these are the figures ``summarize_client`` gives, a failure counting as
    a miss at the window's end. For each request these are lower bounds of what it will
    measure; a queue that is blowing up shows in them within seconds.
    """
    ttft = [(r.first_token_s if r.first_token_s is not None else now_s) - r.sent_s for r in live]
    e2e = [(r.done_s if r.done_s is not None else now_s) - r.sent_s for r in live]
    return percentiles(ttft, "ttft") | percentiles(e2e, "e2e")


def so_far(live: Sequence[LiveRequest]) -> tuple[int, float | None]:
    """Requests that succeeded so far, and the TTFT p95 of those that have their first token."""
    done = 0
    ttfts = []
    for r in live:
        if r.first_token_s is not None:
            ttfts.append(r.first_token_s - r.sent_s)
        if r.done_s is not None:
            done += 1
    return done, float(np.percentile(ttfts, 95)) if ttfts else None


def percentiles(values: Sequence[float], prefix: str, unit: str = "_s") -> dict[str, float]:
    """``{prefix_mean_s, prefix_p50_s, ...}``; empty when there are no values."""
    if not values:
        return {}
    array = np.asarray(values, dtype=np.float64)
    out = {f"{prefix}_mean{unit}": float(array.mean())}
    for q in QUANTILES:
        out[f"{prefix}_p{q}{unit}"] = float(np.percentile(array, q))
    return out


def tail_latencies(
    results: Sequence[RequestResult], duration_s: float
) -> tuple[list[float], list[float], list[float]]:
    """The TTFTs, TPOTs and end-to-end latencies a replay's tails are taken over.

    A request that succeeded counts as measured. One that failed counts as a miss: as if what it
    never received came at the replay's end (``duration_s`` after its start), which is no
    sooner than it would have come had the request succeeded in that replay. So its TTFT is
    the one measured if its first token came, else the time from its send to the end; its
    end-to-end latency is the time from its send to the end; its TPOT, where its first token
    came, is its last token's at the end (and no less than what it showed before failing),
    and where it never came there is none, the request having shown no decode at all. Failing
    a slow request thus never improves a tail, and every value stays finite.
    """
    ttfts, tpots, e2es = [], [], []
    for r in results:
        if r.ok and r.e2e_s is not None:
            # A request asked for no tokens has no first token to time.
            if r.ttft_s is not None:
                ttfts.append(r.ttft_s)
            e2es.append(r.e2e_s)
            if (tpot_s := r.tpot_s) is not None:
                tpots.append(tpot_s)
            continue
        # A request never sent (a replay stopped early) may be due after the end: 0 at least.
        to_end_s = max(duration_s - r.sent_s, r.e2e_s or 0.0, 0.0)
        ttfts.append(to_end_s if r.ttft_s is None else r.ttft_s)
        e2es.append(to_end_s)
        if r.ttft_s is not None and r.output_tokens >= 2:
            tpot_s = (to_end_s - r.ttft_s) / (r.output_tokens - 1)
            if r.e2e_s is not None and r.tokens_received >= 2:
                tpot_s = max(tpot_s, (r.e2e_s - r.ttft_s) / (r.tokens_received - 1))
            tpots.append(tpot_s)
    return ttfts, tpots, e2es


def summarize_client(results: Sequence[RequestResult], duration_s: float) -> dict[str, float]:
    """Client-side figures of one replay: latency percentiles, throughput and errors.

    The latency figures (``ttft_p95_s`` and the like, which SLOs hold and the study scores) are
    over every request, a failed one counting as a miss (``tail_latencies``); where none
    succeeded there are none, the replay having measured no latency at all. The pruner's
    ``provisional`` figures count a failed request the same way, so that they end where these
    begin. Throughput counts the requests that succeeded.
    """
    ok = [r for r in results if r.ok]
    summary: dict[str, float] = {
        "requests": float(len(results)),
        "requests_ok": float(len(ok)),
        "requests_failed": float(len(results) - len(ok)),
        "error_rate": (len(results) - len(ok)) / len(results) if results else 0.0,
        "duration_s": duration_s,
    }
    if ok:
        ttfts, tpots, e2es = tail_latencies(results, duration_s)
        summary |= percentiles(ttfts, "ttft")
        summary |= percentiles(tpots, "tpot")
        summary |= percentiles(e2es, "e2e")
    summary |= percentiles([r.sent_s - r.scheduled_s for r in results], "send_lag")
    if duration_s > 0:
        summary["throughput_req_per_s"] = len(ok) / duration_s
        summary["throughput_output_tokens_per_s"] = sum(r.output_tokens for r in ok) / duration_s
    return summary


@dataclass(frozen=True)
class Histogram:
    """Cumulative bucket counts by upper bound, with their sum and count."""

    buckets: tuple[tuple[float, float], ...]
    sum: float
    count: float

    def minus(self, earlier: Histogram) -> Histogram:
        before = dict(earlier.buckets)
        return Histogram(
            buckets=tuple((le, c - before.get(le, 0.0)) for le, c in self.buckets),
            sum=self.sum - earlier.sum,
            count=self.count - earlier.count,
        )

    @property
    def mean(self) -> float | None:
        return self.sum / self.count if self.count > 0 else None

    def in_first_bucket(self, q: float) -> bool:
        """Whether the ``q`` quantile falls in the first bucket, from 0 to its upper bound.

        There the histogram bounds the quantile from above and says nothing more: vLLM's queue
        and prefill times start with a bucket of 0 to 0.3 s, and ``quantile`` interpolates
        0.285 s for a p95 whose every value was 0.
        """
        return self.count > 0 and bool(self.buckets) and self.buckets[0][1] >= q * self.count

    def quantile(self, q: float) -> float | None:
        """Linear interpolation inside the bucket, as Prometheus' ``histogram_quantile``."""
        if self.count <= 0:
            return None
        rank = q * self.count
        lower_bound, lower_count = 0.0, 0.0
        for upper_bound, count in self.buckets:
            if count >= rank:
                if math.isinf(upper_bound):
                    return lower_bound
                if count == lower_count:
                    return upper_bound
                return lower_bound + (upper_bound - lower_bound) * (rank - lower_count) / (
                    count - lower_count
                )
            lower_bound, lower_count = upper_bound, count
        return lower_bound


@dataclass(frozen=True)
class Scrape:
    """One read of vLLM's ``/metrics``: counters, gauges and histograms summed over labels."""

    values: Mapping[str, float] = field(default_factory=dict)
    histograms: Mapping[str, Histogram] = field(default_factory=dict)


def parse_scrape(text: str) -> Scrape:
    """Parse Prometheus text exposition, keeping the ``vllm:`` families, summed over labels."""
    values: dict[str, float] = {}
    buckets: dict[str, dict[float, float]] = {}
    sums: dict[str, float] = {}
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if not family.name.startswith("vllm:"):
            continue
        for sample in family.samples:
            name = sample.name
            if family.type == "histogram":
                if name.endswith("_bucket"):
                    le = float(sample.labels["le"])
                    per_le = buckets.setdefault(family.name, {})
                    per_le[le] = per_le.get(le, 0.0) + sample.value
                elif name.endswith("_sum"):
                    sums[family.name] = sums.get(family.name, 0.0) + sample.value
                elif name.endswith("_count"):
                    counts[family.name] = counts.get(family.name, 0.0) + sample.value
            elif not name.endswith("_created"):
                values[name] = values.get(name, 0.0) + sample.value
    histograms = {
        name: Histogram(
            buckets=tuple(sorted(per_le.items())),
            sum=sums.get(name, 0.0),
            count=counts.get(name, 0.0),
        )
        for name, per_le in buckets.items()
    }
    return Scrape(values=values, histograms=histograms)


# vLLM's histogram families, and the prefix each gets in a summary. Later vLLM releases renamed
# a few; the first name present wins.
SERVER_HISTOGRAMS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("server_ttft", ("vllm:time_to_first_token_seconds",)),
    ("server_itl", ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds")),
    ("server_queue", ("vllm:request_queue_time_seconds",)),
    ("server_e2e", ("vllm:e2e_request_latency_seconds",)),
    ("server_prefill", ("vllm:request_prefill_time_seconds",)),
    ("server_decode", ("vllm:request_decode_time_seconds",)),
)
SERVER_COUNTERS: tuple[tuple[str, str], ...] = (
    ("server_preemptions", "vllm:num_preemptions_total"),
    ("server_prompt_tokens", "vllm:prompt_tokens_total"),
    ("server_generation_tokens", "vllm:generation_tokens_total"),
    ("server_requests_succeeded", "vllm:request_success_total"),
    # Prompt tokens looked up in the prefix cache, and found there (vLLM's V1 engine).
    ("server_prefix_cache_queries", "vllm:prefix_cache_queries_total"),
    ("server_prefix_cache_hits", "vllm:prefix_cache_hits_total"),
)
GAUGES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("running", ("vllm:num_requests_running",)),
    ("waiting", ("vllm:num_requests_waiting",)),
    ("kv_cache_usage", ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")),
)


def summarize_server(before: Scrape, after: Scrape) -> dict[str, float]:
    """What the server measured between two scrapes: histogram means and quantiles, counters.

    A quantile is ``{prefix}_p{q}_s``, interpolated inside its bucket, except where it falls in
    the histogram's first bucket: there only its bound is known, and it is recorded as
    ``{prefix}_p{q}_at_most_s`` (the bucket's upper bound) instead (nothing where that bucket
    is the one to infinity). The mean, exact, is the figure to read then.
    """
    summary: dict[str, float] = {}
    for prefix, names in SERVER_HISTOGRAMS:
        name = next((n for n in names if n in after.histograms), None)
        if name is None:
            continue
        delta = after.histograms[name]
        if name in before.histograms:
            delta = delta.minus(before.histograms[name])
        if (mean := delta.mean) is not None:
            summary[f"{prefix}_mean_s"] = mean
        for q in QUANTILES:
            if delta.in_first_bucket(q / 100):
                if not math.isinf(bound := delta.buckets[0][0]):
                    summary[f"{prefix}_p{q}_at_most_s"] = bound
            elif (value := delta.quantile(q / 100)) is not None:
                summary[f"{prefix}_p{q}_s"] = value
    for prefix, name in SERVER_COUNTERS:
        if name in after.values:
            summary[prefix] = after.values[name] - before.values.get(name, 0.0)
    return summary


def gauge(scrape: Scrape, names: Iterable[str]) -> float | None:
    """The first of ``names`` (one gauge's names across vLLM versions) the scrape holds."""
    return next((scrape.values[n] for n in names if n in scrape.values), None)


def summarize_gauges(samples: Sequence[Scrape]) -> dict[str, float]:
    """Peak and mean of the running, waiting and KV-cache gauges sampled during the window."""
    summary: dict[str, float] = {}
    for prefix, names in GAUGES:
        values = [v for s in samples if (v := gauge(s, names)) is not None]
        if values:
            summary[f"{prefix}_peak"] = max(values)
            summary[f"{prefix}_mean"] = sum(values) / len(values)
    return summary


def measured_in_flight(results: Sequence[RequestResult]) -> dict[str, Any]:
    """The in-flight distribution a replay actually produced, from send to last token.

    Requests that failed before finishing count until they were sent only; none are dropped.
    """
    sent_s = np.array([r.sent_s for r in results], dtype=np.float64)
    end_s = sent_s + np.array([r.e2e_s or 0.0 for r in results], dtype=np.float64)
    times_s, counts = in_flight(sent_s, end_s)
    return {"estimated": False, **time_weighted(times_s, counts, float(end_s.max(initial=0.0)))}
