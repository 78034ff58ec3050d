"""Where a trial's time went, from vLLM's own ``/metrics`` over its window: a request's mean
time queued, in prefill and in decode, and what the engine's batch and KV cache held.

Pure: reads the figures a trial recorded (``tuner.load.metrics.summarize_server`` and
``summarize_gauges``, kept as its user attributes; a capacity trial's are those of its window at
its capacity, else at the lowest rate it tried) and builds one line of text, plus a reading
where the figures make one clear. A figure the trial lacks (vLLM's CPU build may export no
queue, prefill or decode histogram) is left out; with none at all there is no line.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tuner.flags import flag_name
from tuner.study.plan.space import LONG_PROMPT_TOKENS

MAX_NUM_SEQS = flag_name("max_num_seqs")
# A median inside vLLM's first histogram bucket is kept as that bucket's bound.
ITL_P50_AT_MOST = "server_itl_p50_at_most_s"
# No queue: vLLM's waiting gauge read at most this in every sample (a request caught between
# its arrival and the next step reads 1), and the mean time queued is under this share of a
# request's time in prefill and decode.
QUEUE_WAITING_PEAK = 1
QUEUE_SHARE = 0.01
# No memory pressure: no preemption, and the KV cache never more than this share full.
KV_CACHE_PRESSURE = 0.5
# Decode steps held up by prefill: with prompts of LONG_PROMPT_TOKENS or more on average, an
# inter-token latency p95 at least this many times its median (benchmarks/results/h100-code-7b/).
STALL_FACTOR = 3.0


@dataclass(frozen=True)
class TimeSpent:
    """A trial's figures from vLLM's ``/metrics``; None where it recorded none.

    Times are means per request in seconds; ``kv_cache_peak`` is a share (0 to 1);
    ``max_num_seqs`` is the batch limit the engine ran with, where known.
    """

    queue_s: float | None = None
    prefill_s: float | None = None
    decode_s: float | None = None
    kv_cache_peak: float | None = None
    preemptions: float | None = None
    waiting_peak: float | None = None
    running_mean: float | None = None
    max_num_seqs: int | None = None
    itl_p50_s: float | None = None
    # The median is the bound of the histogram bucket it fell in, not a value.
    itl_p50_at_most: bool = False
    itl_p95_s: float | None = None
    prompt_tokens_mean: float | None = None
    # The share of the prompt tokens looked up in the prefix cache that were found there, and
    # whether the cache was primed first with the blocks the trace sent before the window.
    prefix_cache_hit_rate: float | None = None
    prefix_primed: bool = False

    @property
    def measured(self) -> bool:
        """Whether the trial recorded any of the figures (the batch limit alone is not one)."""
        figures = (self.queue_s, self.prefill_s, self.decode_s, self.kv_cache_peak)
        gauges = (self.preemptions, self.waiting_peak, self.running_mean)
        return any(value is not None for value in (*figures, *gauges))


def time_spent(
    figures: Mapping[str, Any],
    default_max_num_seqs: int | None = None,
    engine_args: Mapping[str, Any] | None = None,
) -> TimeSpent:
    """The trial's measured ``figures`` (``TrialRecord.figures``); its max-num-seqs from its
    ``engine_args``, else ``default_max_num_seqs`` (vLLM's own, where the caller knows it)."""
    seqs = _number(engine_args or {}, MAX_NUM_SEQS)
    if seqs is None and default_max_num_seqs is not None:
        seqs = float(default_max_num_seqs)
    exact_p50 = _number(figures, "server_itl_p50_s")
    bound_p50 = _number(figures, ITL_P50_AT_MOST)
    return TimeSpent(
        queue_s=_number(figures, "server_queue_mean_s"),
        prefill_s=_number(figures, "server_prefill_mean_s"),
        decode_s=_number(figures, "server_decode_mean_s"),
        kv_cache_peak=_number(figures, "kv_cache_usage_peak"),
        preemptions=_number(figures, "server_preemptions"),
        waiting_peak=_number(figures, "waiting_peak"),
        running_mean=_number(figures, "running_mean"),
        max_num_seqs=None if seqs is None else int(seqs),
        itl_p50_s=exact_p50 if exact_p50 is not None else bound_p50,
        itl_p50_at_most=exact_p50 is None and bound_p50 is not None,
        itl_p95_s=_number(figures, "server_itl_p95_s"),
        prompt_tokens_mean=_per_request(figures, "server_prompt_tokens"),
        prefix_cache_hit_rate=_share(
            figures, "server_prefix_cache_hits", "server_prefix_cache_queries"
        ),
        prefix_primed=bool(_number(figures, "prefix_primed_tokens")),
    )


def time_line(trial_number: int, spent: TimeSpent) -> str | None:
    """``where the time went (trial 0): queue 3 ms, prefill 120 ms, decode 2.8 s a request;
    KV cache peak 14%, prefix cache hits 60% of prompt tokens, 0 preemptions, waiting peak 1, 48
    running on average of max-num-seqs 1024``, each part only where measured; None where
    nothing is."""
    if not spent.measured:
        return None
    times = [
        f"{label} {_time(value)}"
        for label, value in (
            ("queue", spent.queue_s),
            ("prefill", spent.prefill_s),
            ("decode", spent.decode_s),
        )
        if value is not None
    ]
    engine = []
    if spent.kv_cache_peak is not None:
        engine.append(f"KV cache peak {spent.kv_cache_peak:.0%}")
    if spent.prefix_cache_hit_rate is not None:
        hits = f"prefix cache hits {spent.prefix_cache_hit_rate:.0%} of prompt tokens"
        if spent.prefix_primed:
            hits += " (primed with the trace's earlier blocks)"
        engine.append(hits)
    if spent.preemptions is not None:
        count = round(spent.preemptions)
        engine.append(f"{count} preemption{'' if count == 1 else 's'}")
    if spent.waiting_peak is not None:
        engine.append(f"waiting peak {spent.waiting_peak:.0f}")
    if spent.running_mean is not None:
        running = f"{_count(spent.running_mean)} running on average"
        if spent.max_num_seqs is not None:
            running += f" of max-num-seqs {spent.max_num_seqs}"
        engine.append(running)
    parts = [f"{', '.join(times)} a request"] if times else []
    if engine:
        parts.append(", ".join(engine))
    return f"where the time went (trial {trial_number}): " + "; ".join(parts)


def reading(spent: TimeSpent) -> str | None:
    """What the figures of vLLM's defaults, kept, say where they say it clearly: no queue (a
    waiting peak of at most ``QUEUE_WAITING_PEAK`` and a mean time queued under ``QUEUE_SHARE``
    of prefill and decode) and no memory pressure (no preemption, the KV cache at most
    ``KV_CACHE_PRESSURE`` full). None where a figure is missing or either is not so."""
    queue_s, prefill_s, decode_s = spent.queue_s, spent.prefill_s, spent.decode_s
    kv_peak, waiting_peak = spent.kv_cache_peak, spent.waiting_peak
    if queue_s is None or prefill_s is None or decode_s is None:
        return None
    if kv_peak is None or waiting_peak is None or spent.preemptions is None:
        return None
    no_queue = waiting_peak <= QUEUE_WAITING_PEAK and queue_s < QUEUE_SHARE * (prefill_s + decode_s)
    no_pressure = spent.preemptions == 0 and kv_peak <= KV_CACHE_PRESSURE
    if not (no_queue and no_pressure):
        return None
    return (
        "no queue and no memory pressure: a request's time went to the engine's compute for "
        "its prefill and decode, not to waiting for a batch slot or for KV cache"
    )


def stalls(spent: TimeSpent) -> str | None:
    """What the figures say where decode steps waited on prefill: prompts of
    ``LONG_PROMPT_TOKENS`` or more on average, no preemption, and an inter-token latency p95 at
    least ``STALL_FACTOR`` times its median. None where a figure is missing or it is not so."""
    p50, p95, prompts = spent.itl_p50_s, spent.itl_p95_s, spent.prompt_tokens_mean
    if p50 is None or p95 is None or prompts is None or spent.preemptions != 0:
        return None
    if prompts < LONG_PROMPT_TOKENS or p50 <= 0 or p95 < STALL_FACTOR * p50:
        return None
    median = f"{'at most ' if spent.itl_p50_at_most else ''}{_time(p50)}"
    return (
        f"decode steps wait on prefill: inter-token latency p95 {_time(p95)} against a median "
        f"of {median}, with prompts of {prompts:.0f} tokens on average; a step that carries a "
        "prefill chunk (up to max-num-batched-tokens tokens) holds up the decodes beside it, so "
        "a smaller max-num-batched-tokens trades TTFT for TPOT"
    )


def time_lines(
    trial_number: int,
    figures: Mapping[str, Any],
    vllm_defaults: Mapping[str, Any],
    defaults_kept: bool,
    engine_args: Mapping[str, Any] | None = None,
) -> list[str]:
    """The line of a trial's ``figures`` (``time_line``) and, where it is vLLM's defaults kept,
    the ``reading`` and ``stalls`` of them where there are; nothing where the trial recorded no
    figure. ``vllm_defaults``: vLLM's own values of engine arguments, by name, where known; the
    trial's own ``engine_args`` win over them."""
    seqs = vllm_defaults.get(MAX_NUM_SEQS)
    spent = time_spent(figures, seqs if isinstance(seqs, int) else None, engine_args)
    line = time_line(trial_number, spent)
    if line is None:
        return []
    if not defaults_kept:
        return [line]
    return [line, *(said for said in (reading(spent), stalls(spent)) if said)]


def _number(values: Any, key: str) -> float | None:
    """``values[key]`` as a float where ``values`` is a mapping and that is a number."""
    value = values.get(key) if isinstance(values, Mapping) else None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _share(figures: Mapping[str, Any], part: str, whole: str) -> float | None:
    """``part`` over ``whole``, where both were measured and ``whole`` is above 0."""
    numerator, denominator = _number(figures, part), _number(figures, whole)
    if numerator is None or not denominator:
        return None
    return numerator / denominator


def _per_request(figures: Mapping[str, Any], key: str) -> float | None:
    """``figures[key]`` over the requests that succeeded, where both are numbers."""
    return _share(figures, key, "server_requests_succeeded")


def _time(seconds: float) -> str:
    """``2.8 s``, ``120 ms``, ``3 ms``, ``0 ms``."""
    return f"{seconds:.3g} s" if seconds >= 1 else f"{seconds * 1000:.3g} ms"


def _count(value: float) -> str:
    """``48``, ``3.5``: a mean count, to a tenth below ten."""
    return f"{value:.0f}" if value >= 10 else f"{value:.1f}"
