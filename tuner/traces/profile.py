"""The shape of a workload at a glance: rates, lengths, burstiness, in-flight concurrency.

Pure: summarises a ``Trace`` (or a ``ConcurrencyTrace``) already in memory. In-flight
concurrency of a request trace is estimated from arrivals and a service-time model (prefill at
``prefill_tokens_per_s``, then ``tpot_s`` per output token, no queueing); a concurrency trace's
is measured, so it is reported as it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from tuner.traces.concurrency import ConcurrencyTrace
from tuner.traces.model import Trace, busiest_window

PERCENTILES = (50, 90, 99)


@dataclass(frozen=True)
class ServiceModel:
    """How long a request is in flight when nothing queues: prefill, then decode."""

    prefill_tokens_per_s: float = 8000.0
    tpot_s: float = 0.03

    def service_s(self, input_tokens: np.ndarray, output_tokens: np.ndarray) -> np.ndarray:
        return input_tokens / self.prefill_tokens_per_s + output_tokens * self.tpot_s


def in_flight(arrival_s: np.ndarray, finish_s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The in-flight count as a step function: ``(change times, count from each time on)``."""
    times = np.concatenate((arrival_s, finish_s))
    steps = np.concatenate((np.ones(len(arrival_s)), -np.ones(len(finish_s))))
    # Ends before starts at equal times: a request that ends as another starts never overlaps.
    order = np.lexsort((steps, times))
    return times[order], np.cumsum(steps[order])


def time_weighted(times_s: np.ndarray, values: np.ndarray, end_s: float) -> dict[str, float]:
    """Mean, percentiles, max and idle share of a step function over ``[times_s[0], end_s]``."""
    if not len(times_s):
        return {"mean": 0.0, "max": 0.0, "idle_share": 1.0} | {f"p{q}": 0.0 for q in PERCENTILES}
    durations = np.diff(np.append(times_s, max(end_s, float(times_s[-1]))))
    total = float(durations.sum())
    if total <= 0:
        durations, total = np.ones(len(values)), float(len(values))
    order = np.argsort(values, kind="stable")
    cumulative = np.cumsum(durations[order]) / total
    out = {
        "mean": float(np.sum(values * durations) / total),
        "max": float(values.max()),
        "idle_share": float(durations[values <= 0].sum() / total),
    }
    for q in PERCENTILES:
        index = min(int(np.searchsorted(cumulative, q / 100, side="left")), len(order) - 1)
        out[f"p{q}"] = float(values[order[index]])
    return out


def _percentiles(values: np.ndarray) -> dict[str, float]:
    out = {"mean": float(values.mean()), "max": float(values.max())}
    out |= {f"p{q}": float(np.percentile(values, q)) for q in PERCENTILES}
    return out


def _burstiness(arrival_s: np.ndarray) -> dict[str, float]:
    gaps = np.diff(arrival_s)
    if len(gaps) < 2 or gaps.mean() <= 0:
        return {"interarrival_mean_s": float(gaps.mean()) if len(gaps) else 0.0}
    mean, std = float(gaps.mean()), float(gaps.std())
    per_second = np.bincount(np.floor(arrival_s - arrival_s[0]).astype(np.int64))
    return {
        "interarrival_mean_s": mean,
        "interarrival_cv": std / mean,
        "burstiness": (std - mean) / (std + mean),
        "dispersion_1s": float(per_second.var() / per_second.mean()),
        "longest_gap_s": float(gaps.max()),
    }


def _prefix_reuse(trace: Trace) -> float | None:
    """Share of prompt blocks already seen earlier in the trace (a prefix cache's best case)."""
    if trace.hash_ids is None:
        return None
    seen: set[int] = set()
    total = reused = 0
    for ids in trace.hash_ids:
        for block in ids:
            total += 1
            if block in seen:
                reused += 1
            else:
                seen.add(block)
    return reused / total if total else 0.0


def profile_trace(
    trace: Trace, window_s: float = 60.0, service: ServiceModel | None = None
) -> dict[str, Any]:
    """Everything ``tuner trace inspect`` reports of a request trace, as plain numbers."""
    service = service or ServiceModel()
    n = len(trace)
    arrival_s = trace.arrival_s
    span_s = trace.span_s
    ends = np.searchsorted(arrival_s, arrival_s + 1.0, side="left")
    finish_s = arrival_s + service.service_s(trace.input_tokens, trace.output_tokens)
    times_s, counts = in_flight(arrival_s, finish_s)
    start_s, window = busiest_window(trace, window_s)
    profile: dict[str, Any] = {
        "source": trace.source,
        "requests": n,
        "span_s": span_s,
        "mean_rate_per_s": n / span_s if span_s > 0 else float(n),
        "peak_rate_1s_per_s": float(np.max(ends - np.arange(n))) if n else 0.0,
        "input_tokens": _percentiles(trace.input_tokens),
        "output_tokens": _percentiles(trace.output_tokens),
        "arrivals": _burstiness(arrival_s),
        "in_flight": {
            "estimated": True,
            "model": {
                "prefill_tokens_per_s": service.prefill_tokens_per_s,
                "tpot_s": service.tpot_s,
            },
            **time_weighted(times_s, counts, float(finish_s.max()) if n else 0.0),
        },
        "busiest_window": {
            "window_s": min(window_s, span_s) or window_s,
            "start_s": start_s,
            "requests": len(window),
            "rate_per_s": len(window) / window_s if window_s else 0.0,
        },
    }
    if trace.session_id is not None:
        profile["sessions"] = len(np.unique(trace.session_id))
    reuse = _prefix_reuse(trace)
    if reuse is not None:
        profile["prefix_block_reuse"] = reuse
        profile["block_tokens"] = trace.block_tokens
    return profile


def profile_concurrency(trace: ConcurrencyTrace) -> dict[str, Any]:
    """What ``tuner trace inspect`` reports of a concurrency trace: its measured distribution."""
    return {
        "source": trace.source,
        "samples": len(trace.time_s),
        "span_s": trace.span_s,
        "in_flight": {
            "estimated": False,
            **time_weighted(trace.time_s, trace.concurrency, trace.end_s),
        },
    }


def _row(label: str, stats: dict[str, float], unit: str = "") -> str:
    parts = [f"p{q} {stats[f'p{q}']:.0f}" for q in PERCENTILES]
    return (
        f"{label:<18} mean {stats['mean']:.1f}, "
        + ", ".join(parts)
        + f", max {stats['max']:.0f}{unit}"
    )


def format_profile(profile: dict[str, Any]) -> str:
    """The profile as lines for a person."""
    lines = [f"{profile['source']}"]
    flight = profile["in_flight"]
    if "requests" not in profile:
        lines.append(f"{'samples':<18} {profile['samples']} over {profile['span_s']:.0f} s")
        lines.append(_row("concurrency", flight) + f", idle {flight['idle_share']:.0%} of the time")
        return "\n".join(lines)
    lines.append(
        f"{'requests':<18} {profile['requests']} over {profile['span_s']:.0f} s: "
        f"mean {profile['mean_rate_per_s']:.2f} req/s, peak {profile['peak_rate_1s_per_s']:.0f} "
        "in one second"
    )
    lines.append(_row("input tokens", profile["input_tokens"]))
    lines.append(_row("output tokens", profile["output_tokens"]))
    arrivals = profile["arrivals"]
    if "interarrival_cv" in arrivals:
        lines.append(
            f"{'inter-arrival':<18} mean {arrivals['interarrival_mean_s'] * 1000:.0f} ms, "
            f"CV {arrivals['interarrival_cv']:.2f} (Poisson 1), burstiness "
            f"{arrivals['burstiness']:+.2f} (Poisson 0), longest gap "
            f"{arrivals['longest_gap_s']:.1f} s"
        )
    model = flight["model"]
    lines.append(
        _row("in flight (est.)", flight)
        + f", idle {flight['idle_share']:.0%} of the time"
        + f" [prefill {model['prefill_tokens_per_s']:.0f} tok/s,"
        + f" {model['tpot_s'] * 1000:.0f} ms/token]"
    )
    window = profile["busiest_window"]
    lines.append(
        f"{'busiest window':<18} {window['window_s']:g} s from {window['start_s']:.1f} s: "
        f"{window['requests']} requests ({window['rate_per_s']:.2f} req/s), what tuner run replays"
    )
    if "sessions" in profile:
        lines.append(f"{'sessions':<18} {profile['sessions']}")
    if "prefix_block_reuse" in profile:
        lines.append(
            f"{'prefix reuse':<18} {profile['prefix_block_reuse']:.0%} of "
            f"{profile['block_tokens']}-token prompt blocks seen before"
        )
    return "\n".join(lines)
