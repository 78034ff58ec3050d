"""The search space tuner offers when a study names none, and the capture range it pins.

On vLLM's CPU build, the defaults of ``tuner.study.plan.spec``. On a GPU, max-num-seqs reaches
vLLM's own default for that GPU (log scale), max-num-batched-tokens is offered as a few levels
(each compiles once), one or two API server processes are offered, and the CUDA-graph capture
range is searched over values that cover the trace's prompt lengths; where the range is not
searched, it is pinned after trial 0 so that searched trials share vLLM's compiles.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import yaml

from tuner.engine.environment import Gpu, HostMemory
from tuner.engine.process import API_SERVER_COUNT
from tuner.engine.vllm_defaults import BatchDefaults
from tuner.flags import MAX_CAPTURE_SIZE, flag_name, sets_capture_range
from tuner.study.plan.spec import DEFAULT_SPEC, StudySpec

# max-num-batched-tokens on a GPU: a few levels, since each compiles once
# (benchmarks/results/h100/).
GPU_BATCHED_TOKENS_LEVELS = [2048, 4096, 8192, 16384]
# The largest capture size offered: vLLM captures one graph per size, so time and memory grow.
CAPTURE_SIZE_CEILING = 2048
# vLLM's default capture ceiling before Blackwell: pinned across trials where not searched.
PINNED_CAPTURE_SIZE = 512
# vLLM 0.26.0's `vllm serve` batch defaults on a GPU (EngineArgs.get_batch_defaults): the
# large tier (at least 70 GiB, not an A100) and the other; the fallback where vLLM is not asked.
LARGE_GPU_MEMORY_MIB = 70 * 1024
LARGE_GPU_MAX_NUM_SEQS = 1024
GPU_MAX_NUM_SEQS = 256
LARGE_GPU_BATCHED_TOKENS = 8192
GPU_BATCHED_TOKENS = 2048
# An app's own engine (AsyncLLM.from_engine_args) takes the scheduler's defaults, not the
# server's (benchmarks/results/h200-translate-app/).
ENGINE_MAX_NUM_SEQS = 128
ENGINE_BATCHED_TOKENS = 2048
# Mean prompt length from which prefill bounds capacity and the search moves
# max-num-batched-tokens first (benchmarks/results/h100-conv-7b/).
LONG_PROMPT_TOKENS = 1024
# Its levels there, largest first, so the first move from the large-GPU default is a factor of
# 4 down (benchmarks/results/h100-code-7b/ and h200-code-7b/).
PREFILL_BOUND_BATCHED_TOKENS_LEVELS = [16384, 8192, 2048]


# API server processes offered on a GPU: a second one lifts capacity on some hosts, so the
# confirmation decides per workload (benchmarks/results/gpu-frontend/ and h200-knobs-code/).
GPU_API_SERVER_COUNTS = [1, 2]


# vLLM's CPU build reads gpu-memory-utilization as a share of host memory: trial 0 takes the
# largest step of the share that asks at most CPU_SHARE_OF_AVAILABLE of the memory available.
VLLM_DEFAULT_SHARE = 0.9
CPU_SHARE_STEP = 0.05
CPU_SHARE_OF_AVAILABLE = 0.5
KV_ARGUMENTS = ("gpu-memory-utilization", "kv-cache-memory-bytes")
# The least share offered on the CPU build: below it the worker has no KV cache left
# (benchmarks/results/cpu-quickstart-fresh/).
CPU_SMALLEST_SHARE_BYTES = 3 << 29  # 1.5 GiB
# How late tuner's client may run in a window on the CPU build before its figures are not
# trusted: client lag on two shared cores (benchmarks/results/cpu-client-lag/).
CPU_CLIENT_TOLERANCE_S = 1.0
# Requests a GPU capacity study replays on every engine before its first rate, so fresh engines
# are measured warm (benchmarks/results/h100-gate-warm/).
GPU_CAPACITY_WARMUP_REQUESTS = 200


def cpu_kv_share(memory: HostMemory) -> float:
    """The KV-cache share trial 0 takes on vLLM's CPU build with this ``memory``: at most vLLM's
    default, at least one step."""
    fits = CPU_SHARE_OF_AVAILABLE * memory.available_bytes / max(memory.total_bytes, 1)
    steps = math.floor(round(min(fits, VLLM_DEFAULT_SHARE) / CPU_SHARE_STEP, 6))
    return round(max(1, steps) * CPU_SHARE_STEP, 2)


def cpu_share_low(memory: HostMemory) -> float:
    """The least KV-cache share the default space offers on vLLM's CPU build with this
    ``memory``: the first step that asks ``CPU_SMALLEST_SHARE_BYTES``."""
    steps = math.ceil(
        round(CPU_SMALLEST_SHARE_BYTES / max(memory.total_bytes, 1) / CPU_SHARE_STEP, 6)
    )
    return round(max(1, steps) * CPU_SHARE_STEP, 2)


def runnable_baseline(spec: StudySpec, memory: HostMemory | None) -> tuple[StudySpec, str | None]:
    """On vLLM's CPU build, ``spec`` with a baseline, and candidates, that can start on this
    machine, and a line that says what was set and why; ``spec`` unchanged (and None) where the
    spec sizes the KV cache itself (for every trial, or for the baseline and each candidate) or
    the memory is unknown."""

    def sizes(args: Mapping[str, Any]) -> bool:
        return any(name in args for name in KV_ARGUMENTS)

    if memory is None or sizes(spec.engine_args):
        return spec, None
    share = cpu_kv_share(memory)
    sized = {KV_ARGUMENTS[0]: share}
    baseline = spec.baseline if sizes(spec.baseline) else {**spec.baseline, **sized}
    candidates = tuple(c if sizes(c) else {**c, **sized} for c in spec.candidates)
    which = [
        *(["trial 0 runs vLLM's defaults"] if not sizes(spec.baseline) else []),
        *(["the spec's candidates run"] if candidates != spec.candidates else []),
    ]
    if not which:
        return spec, None
    gib = 1 << 30
    note = (
        f"{' and '.join(which)} with gpu-memory-utilization {share:g}, at most half of the "
        f"{memory.available_bytes / gib:.1f} GiB available now: vLLM's CPU build reads that "
        f"argument as the share of host memory ({memory.total_bytes / gib:.1f} GiB) for its KV "
        f"cache; its default, {VLLM_DEFAULT_SHARE}, would take "
        f"{VLLM_DEFAULT_SHARE * memory.total_bytes / gib:.1f} GiB beside vLLM's own worker, "
        "tuner's client and whatever else runs here, and does not start where that is more "
        "than is free"
    )
    return replace(spec, baseline=baseline, candidates=candidates), note


def _pow2_at_least(n: float) -> int:
    return 1 << max(0, math.ceil(math.log2(max(n, 1))))


def capture_choices(
    prompt_tokens: list[int] | None, max_num_seqs: int, min_num_seqs: int | None = None
) -> list[int]:
    """Capture sizes for the capture-range dimension: powers of two covering the token counts
    the workload's steps carry (``gpu_search_space`` adds vLLM's own range among them).

    A step that admits a prompt carries that prompt (or its chunk) beside up to max-num-seqs
    decodes: the range runs from the step of a median prompt beside ``min_num_seqs`` decodes
    (the smallest max-num-seqs searched; by default ``max_num_seqs``) to the step of two
    99th-percentile prompts beside ``max_num_seqs``, at most ``CAPTURE_SIZE_CEILING``. (With
    the GPU space's max-num-seqs reaching 1024, a low end at 1024 decodes would leave out the
    ranges of 256 and 512 that measured best at max-num-seqs 16 and 32.) Without prompt lengths
    (a concurrency trace), up to vLLM's default ceiling.
    """
    if prompt_tokens:
        ordered = sorted(prompt_tokens)
        median = ordered[len(ordered) // 2]
        p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
        low = _pow2_at_least(median + (max_num_seqs if min_num_seqs is None else min_num_seqs))
        high = _pow2_at_least(2 * p99 + max_num_seqs)
    else:
        low = high = PINNED_CAPTURE_SIZE
    high = min(high, CAPTURE_SIZE_CEILING)
    low = min(low, high)
    sizes: list[int] = []
    size = low
    while size <= high:
        sizes.append(size)
        size *= 2
    return sizes


def vllm_default_capture_size(max_num_seqs: int) -> int:
    """The largest CUDA-graph capture size vLLM uses where none is given: twice max-num-seqs, at
    most ``PINNED_CAPTURE_SIZE`` (``VllmConfig._set_cudagraph_sizes`` in vLLM 0.26.0 and 0.32.0;
    on Blackwell, compute capability 10.x, the ceiling is 1024, which nvidia-smi's GPU name
    does not tell tuner)."""
    return min(2 * max_num_seqs, PINNED_CAPTURE_SIZE)


def vllm_default_max_num_seqs(device: Gpu | None) -> int:
    """vLLM's default max-num-seqs on ``device``, the GPU vLLM opens first (its device 0).

    vLLM reads the memory from the device; tuner from nvidia-smi. Where that gives none (no
    nvidia-smi, or "[N/A]"), 256: the smaller default, the one vLLM itself falls back to when
    it cannot read the device.
    """
    if device is None or device.memory_mib is None:
        return GPU_MAX_NUM_SEQS
    if device.memory_mib >= LARGE_GPU_MEMORY_MIB and "a100" not in device.name.lower():
        return LARGE_GPU_MAX_NUM_SEQS
    return GPU_MAX_NUM_SEQS


def table_batch_defaults(gpu: bool, device: Gpu | None) -> tuple[int, int]:
    """tuner's own table of vLLM's max-num-seqs and max-num-batched-tokens (vLLM 0.26.0 on a
    GPU, the CPU build 0.32.0 off one): what a spec starts from where the installed vLLM does
    not say."""
    if not gpu:
        space = DEFAULT_SPEC["search_space"]
        return space["max-num-seqs"]["default"], space["max-num-batched-tokens"]["default"]
    seqs = vllm_default_max_num_seqs(device)
    return seqs, LARGE_GPU_BATCHED_TOKENS if seqs == LARGE_GPU_MAX_NUM_SEQS else GPU_BATCHED_TOKENS


def gpu_search_space(
    prompt_tokens: list[int] | None, device: Gpu | None, batch: BatchDefaults | None = None
) -> dict[str, Any]:
    """The default search space on ``device``: one or two API server processes, max-num-seqs up
    to vLLM's default there (log scale), max-num-batched-tokens as compile levels, the CUDA-graph
    capture range, and the KV-cache share.

    The order is the order in which the search moves each dimension from vLLM's defaults
    (``tuner.study.trials.incumbent``): what measured the largest effect first. On one H100 the API
    server bound vLLM's defaults on short streamed requests (``GPU_API_SERVER_COUNTS``); the
    capture range comes next (the comment there says why), while a share of memory above
    vLLM's 0.9 only adds KV cache that a large GPU's defaults do not fill. The capture range's
    default is the range vLLM uses at its default max-num-seqs, placed among the levels by its
    size, so that the search widens or narrows it from there. Where the prompts are long
    (``prefill_bound``), max-num-batched-tokens moves first. vLLM's defaults are ``batch``'s
    where given (those of the vLLM installed: ``tuner.engine.vllm_defaults``), else tuner's
    table of vLLM 0.26.0's for ``device``."""
    seqs_high, batched_default = table_batch_defaults(True, device)
    if batch is not None:  # the installed vLLM's own, over tuner's table of them
        seqs_high, batched_default = batch.max_num_seqs, batch.max_num_batched_tokens
    vllm_range = vllm_default_capture_size(seqs_high)
    captures = capture_choices(prompt_tokens, seqs_high, min_num_seqs=1)
    long_prompts = prefill_bound(prompt_tokens)
    batched_tokens = _batched_tokens(long_prompts, batched_default)
    space: dict[str, Any] = {}
    if long_prompts:
        space["max-num-batched-tokens"] = batched_tokens
    space[API_SERVER_COUNT] = {
        "type": "categorical",
        "choices": list(GPU_API_SERVER_COUNTS),
        "default": 1,
    }
    # The capture range right after the API servers: two servers' batches outgrow vLLM's
    # default range, so the next move tries the pair (benchmarks/results/h200-asc-capture/).
    space[MAX_CAPTURE_SIZE] = {
        "type": "categorical",
        "choices": sorted({*captures, vllm_range}),
        "default": vllm_range,
    }
    space["max-num-seqs"] = {
        "type": "int",
        "low": 1,
        "high": seqs_high,
        "log": True,
        "default": seqs_high,
    }
    space.setdefault("max-num-batched-tokens", batched_tokens)
    space["gpu-memory-utilization"] = {
        **DEFAULT_SPEC["search_space"]["gpu-memory-utilization"],
        "default": VLLM_DEFAULT_SHARE,
    }
    return space


def _batched_tokens(long_prompts: bool, default: int) -> dict[str, Any]:
    """max-num-batched-tokens as levels (each compiles once), vLLM's ``default`` among them."""
    levels = PREFILL_BOUND_BATCHED_TOKENS_LEVELS if long_prompts else GPU_BATCHED_TOKENS_LEVELS
    choices = list(levels) if default in levels else [*levels, default]
    return {"type": "categorical", "choices": choices, "default": default}


def prefill_bound(prompt_tokens: list[int] | None) -> bool:
    """Whether the trace's prompts are long enough (``LONG_PROMPT_TOKENS`` on average) that
    prefill, whose chunk per step is max-num-batched-tokens, is what the GPU mostly does."""
    if not prompt_tokens:
        return False
    return sum(prompt_tokens) / len(prompt_tokens) >= LONG_PROMPT_TOKENS


def engine_defaults(spec: StudySpec) -> tuple[StudySpec, dict[str, Any]]:
    """The spec with vLLM's defaults for an engine an app builds from AsyncEngineArgs
    (``ENGINE_MAX_NUM_SEQS``, ``ENGINE_BATCHED_TOKENS`` and the capture range that follows) as
    its space's defaults, where it gives one that differs: where the search starts, and what the
    configuration written is measured against. A categorical dimension lacking the value gets it
    among its choices. Also the defaults replaced, by dimension: for a spec ``tuner init``
    wrote on a GPU, what vLLM's OpenAI server takes there."""
    engine = {
        "max-num-seqs": ENGINE_MAX_NUM_SEQS,
        "max-num-batched-tokens": ENGINE_BATCHED_TOKENS,
        MAX_CAPTURE_SIZE: vllm_default_capture_size(ENGINE_MAX_NUM_SEQS),
    }
    space, was = [], {}
    for dim in spec.space:
        value = engine.get(flag_name(dim.name))
        if value is None or not dim.has_default or dim.default == value:
            space.append(dim)
            continue
        was[dim.name] = dim.default
        choices = _with_choice(dim.choices, value) if dim.kind == "categorical" else dim.choices
        space.append(replace(dim, default=value, choices=choices))
    if not was:
        return spec, {}
    return replace(spec, space=tuple(space)), was


def _with_choice(choices: tuple[Any, ...], value: Any) -> tuple[Any, ...]:
    """``choices`` with ``value`` among them, in their order where they are sorted either way
    (the search's order), else last."""
    if value in choices:
        return choices
    numbers = [c for c in choices if isinstance(c, int | float)]
    if len(numbers) == len(choices):
        if numbers == sorted(numbers):
            return tuple(sorted([*numbers, value]))
        if numbers == sorted(numbers, reverse=True):
            return tuple(sorted([*numbers, value], reverse=True))
    return (*choices, value)


def capture_pin(spec: StudySpec, cpu_build: bool) -> dict[str, Any]:
    """Engine arguments that pin the capture range across searched trials, or none.

    vLLM's default range follows max-num-seqs, and the range is part of vLLM's compile key, so
    by default every new max-num-seqs recompiles. Pinned (to the range vLLM takes at the
    spec's default max-num-seqs, the baseline's; ``PINNED_CAPTURE_SIZE`` where the spec gives
    none), trials that differ in max-num-seqs or gpu-memory-utilization can share one compile.
    Nothing is pinned where the range is searched or set by the spec, where graphs are off
    (``enforce-eager``), or on vLLM's CPU build (no CUDA graphs).
    """
    if cpu_build or spec.engine_args.get("enforce-eager") is True:
        return {}
    searched = {d.name: 0 for d in spec.space}
    if sets_capture_range({**spec.engine_args, **searched}):
        return {}
    seqs = {flag_name(k): v for k, v in spec.vllm_defaults.items()}.get("max-num-seqs")
    if not isinstance(seqs, int) or seqs < 1:
        return {MAX_CAPTURE_SIZE: PINNED_CAPTURE_SIZE}
    return {MAX_CAPTURE_SIZE: vllm_default_capture_size(seqs)}


# What every written spec says of its settings, above them.
SPEC_HEADER = (
    "# tuner study spec. Engine arguments use vLLM's names (dashes or underscores).\n"
    "# search_space: type int | float | categorical; low, high, step, log, choices;\n"
    "#   default: vLLM's value where the argument is not given (where the search starts).\n"
    "# search: incumbent (from vLLM's defaults, one dimension at a time, moving with the\n"
    "#   best so far; TPE once it has nothing left to propose) or tpe.\n"
    "# slos: limits in seconds on client-side tails; a trial over any is infeasible.\n"
    "# weights: of each tail divided by its SLO in the score; lower score is better.\n"
    "# baseline: engine arguments of trial 0 beyond engine_args ({} = vLLM's defaults).\n"
    "# candidates: configurations measured right after the baseline, e.g. production's:\n"
    "#   [{max-num-seqs: 16, max-num-batched-tokens: 8192}]; searched trials follow.\n"
    "# prune_factor: stop a trial once a metric is this many times its SLO, or this many\n"
    "#   times worse than the best trial at the same point (0: never); prune_after_s: not\n"
    "#   before this many seconds into the window.\n"
    "# model: a local folder or a Hugging Face id (resolved as vLLM resolves it).\n"
    "# dummy_model: a shape tuner writes at `model` unless a whole one is there, its random\n"
    "#   weights saved (none with load-format dummy); null for a real model.\n"
    "# engine_args load-format: dummy measures random weights of the model's shape; the\n"
    "#   configuration written never carries it.\n"
    "# time_scale: a factor on the trace's arrival times, or auto: replay at calibrate_load\n"
    "#   times what vLLM's defaults carry within the SLOs on this machine (measured once).\n"
    "# objective_mode: latency (the best score at the window's rate), capacity (the\n"
    "#   highest rate one server carries within the SLOs: each trial starts vLLM once and\n"
    "#   replays the window time-scaled to each rate, capacity_probe_s seconds a rate,\n"
    "#   until a passing and a failing rate are within capacity_resolution; at most\n"
    "#   capacity_max_probes rates a trial; each rate judged on capacity_min_requests at\n"
    "#   least, after a lead-in) or goodput (searched as capacity is: the highest rate at\n"
    "#   which goodput_share of the requests meet every SLO, each on its own TTFT, TPOT and\n"
    "#   end-to-end time). Pruning applies to latency studies only.\n"
    "# confirm_top_k, confirm_repeats: before naming a winner, the search's finalist and the\n"
    "#   baseline are measured on confirm_repeats fresh engines each, in turns (ABBA); the\n"
    "#   finalist is written only where each of its fresh measurements beats each of the\n"
    "#   baseline's (at 3 each: 1 chance in 20 for a finalist no better), else the baseline\n"
    "#   is. The search's own measurements choose; they never count. confirm_top_k: 0 or 1.\n"
    "# time_budget_s: seconds the whole run may take; the confirmation is held back from it.\n"
    "# warm_prefix_cache: where the trace records shared prompt blocks (hash_ids), each replay\n"
    "#   first sends those the trace sent before the window, as a running server would hold\n"
    "#   them in its prefix cache; false: every replay starts from an empty cache.\n"
    "# search_layout: with --gpus, a capacity or goodput study first measures vLLM's\n"
    "#   defaults at each layout (tensor-parallel-size x data-parallel-size) the model fits on\n"
    "#   the GPUs, and searches on the one with the most req/s per GPU (docs/workers.md);\n"
    "#   false: the smallest layout that fits.\n"
    "# server: your own app around vLLM's AsyncLLM, started per trial instead of vLLM's\n"
    "#   server: its command and request (docs/own-server.md); null: vLLM's server.\n"
)


def _gpu_header(device: Gpu | None, capacity: bool, prompt_tokens: list[int] | None) -> str:
    """What a GPU spec says besides: the order and levels of its space, and for a capacity
    study its warm-up. Each key in one sentence, with the results page behind it."""
    seqs_high = vllm_default_max_num_seqs(device)
    header = (
        "# search_space lists the dimensions in the order the search moves them, the largest\n"
        "#   measured effect first.\n"
    )
    if prefill_bound(prompt_tokens):
        header += (
            "# max-num-batched-tokens: the prefill tokens a step may carry; first, as this\n"
            f"#   trace's prompts ({LONG_PROMPT_TOKENS}+ tokens on average) make prefill the main\n"
            "#   work, and down to 2048 at once: smaller chunks stall decodes less\n"
            "#   (benchmarks/results/h100-code-7b/, h200-code-7b/).\n"
        )
    header += (
        f"# max-num-seqs: 1 to {seqs_high}, vLLM's own default on this GPU, log scale: few\n"
        "#   sequences carry far less than the default (benchmarks/results/h100/).\n"
        "# compilation-config.max_cudagraph_capture_size: the largest step, in tokens, that\n"
        "#   vLLM runs as a CUDA graph; a busy server outgrows vLLM's default range\n"
        "#   (benchmarks/results/h200-asc-capture/).\n"
        "# api-server-count: the HTTP front-end processes; a second one lifts capacity on some\n"
        "#   hosts and not on others (benchmarks/results/gpu-frontend-knobs/).\n"
        "# stream-interval is not searched: it sends tokens in chunks, which no SLO measures.\n"
        "#   Where your clients accept chunks, add to search_space:\n"
        "#   stream-interval: {type: categorical, choices: [1, 4]}\n"
    )
    if capacity:
        header += (
            f"# warmup_requests: the window's first {GPU_CAPACITY_WARMUP_REQUESTS} requests\n"
            "#   (those of its first 15 s at most), replayed on each engine before its first rate\n"
            "#   so that no configuration is judged cold (benchmarks/results/h100-gate-warm/).\n"
        )
    return header


def default_spec_text(
    model: str | None = None,
    gpu: bool = False,
    prompt_tokens: list[int] | None = None,
    device: Gpu | None = None,
    cpu_memory: HostMemory | None = None,
    dummy_weights: bool = False,
    overrides: Mapping[str, Any] | None = None,
    batch: BatchDefaults | None = None,
    searches_rates: bool = False,
) -> str:
    """The spec ``tuner run`` writes when there is none. With ``gpu`` (not vLLM's CPU build),
    max-num-seqs reaches vLLM's default on ``device`` (the GPU vLLM will open first; None where
    unknown), the search space adds the CUDA-graph capture range, its values from the trace's
    ``prompt_tokens``, and offers max-num-batched-tokens as a few levels. ``batch``: vLLM's
    defaults as the vLLM installed gives them, used where it runs on the platform the spec is
    for (its GPU build for ``gpu``, else its CPU build). ``searches_rates``: the objective
    ``overrides`` names searches rates (``StudyObjective.searches_rates``); on a GPU each
    engine is then warmed up before its first rate."""
    spec = dict(DEFAULT_SPEC)
    if model is not None:
        # The user's model, with no engine argument (max-model-len included) that the user
        # did not ask for.
        spec["model"] = model
        spec["dummy_model"] = None
    # The weights on disk (the demo model's saved ones, or the user's) unless asked otherwise.
    spec["engine_args"] = {"load-format": "dummy"} if dummy_weights else {}
    spec.update(overrides or {})
    if batch is not None and not batch.fits(gpu):
        batch = None  # asked of another build than the one this spec is for
    if batch is not None and not gpu:
        spec["search_space"] = batch.over(spec["search_space"])
    if gpu:
        spec["search_space"] = gpu_search_space(prompt_tokens, device, batch)
        if searches_rates:
            spec["warmup_requests"] = GPU_CAPACITY_WARMUP_REQUESTS
    elif cpu_memory is not None:
        # vLLM's CPU build: shares up to what trial 0 takes here, not shares that cannot start.
        low = cpu_share_low(cpu_memory)
        high = max(cpu_kv_share(cpu_memory), round(low + CPU_SHARE_STEP, 2))
        spec["search_space"] = {
            **spec["search_space"],
            KV_ARGUMENTS[0]: {"type": "float", "low": low, "high": high, "step": CPU_SHARE_STEP},
        }
        spec["client_tolerance_s"] = CPU_CLIENT_TOLERANCE_S
    header = SPEC_HEADER
    if gpu:
        header += _gpu_header(device, searches_rates, prompt_tokens)
    return header + yaml.safe_dump(spec, sort_keys=False)
