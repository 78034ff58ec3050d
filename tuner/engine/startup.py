"""Where an engine's start-up time goes, read from vLLM's log.

Pure. Two sources: markers (lines whose first appearance ``tuner.engine.process`` timestamps
while it waits for ``/health``), and the durations vLLM itself reports ("took 3.2 s"). Patterns
cover the CPU build (0.32) and the GPU release (0.26); a line that a version does not print
simply leaves its phase out.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime

# First appearance of each marks the end of a phase.
MARKERS: dict[str, re.Pattern[str]] = {
    # The API server has imported vLLM and parsed its arguments.
    "server_imported": re.compile(r"non-default args"),
    # The engine-core process has started (and imported what it needs).
    "engine_process": re.compile(r"^\(EngineCore", re.MULTILINE),
    "server_listening": re.compile(
        r"Starting vLLM (?:API )?server on|Application startup complete"
    ),
}

# Durations vLLM reports about itself, in seconds.
DURATIONS: dict[str, re.Pattern[str]] = {
    "model_load_s": re.compile(
        r"(?:Model loading took [\d.]+ GiB(?: memory)? and|Initializing model took|"
        r"Loading weights took) ([\d.]+) s"
    ),
    # "takes" until vLLM 0.1x, "took" in 0.26.
    "torch_compile_s": re.compile(r"torch\.compile (?:takes|took) ([\d.]+) s in total"),
    "cuda_graph_s": re.compile(r"Graph capturing finished in ([\d.]+) sec"),
    "engine_init_s": re.compile(
        r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s"
    ),
    # Inside torch_compile_s: Dynamo's trace (on a cache hit with vLLM's AOT artefact, its
    # load and source check), then Inductor compiling each compile range, or loading it.
    "dynamo_s": re.compile(r"Dynamo bytecode transform time: ([\d.]+) s"),
    "graph_compile_s": re.compile(r"Compiling a graph for compile range \(.*?\) takes ([\d.]+) s"),
    "graph_load_s": re.compile(
        r"Directly load the compiled graph\(s\) for compile range \(.*?\) .*took ([\d.]+) s"
    ),
}

# vLLM's own log lines carry the wall clock to the second ("INFO 11-23 18:46:16 [file.py:12]").
LOG_TIME = re.compile(r"\b(?:INFO|WARNING|DEBUG|ERROR) (\d\d-\d\d \d\d:\d\d:\d\d) \[")

# The engine's start, step by step: each step ends at the first line matching its pattern, in
# this order; they start at the API server's "non-default args". Times are vLLM's (whole
# seconds), so each step is good to about a second.
STEPS: tuple[tuple[str, re.Pattern[str]], ...] = (
    # The API server resolves the config and starts the engine-core process.
    ("engine_process", re.compile(r"Initializing a V1 LLM engine")),
    # The worker sets up the device and the distributed state.
    ("worker_init", re.compile(r"Starting to load model|Loading model from scratch")),
    ("model_load", re.compile(r"Model loading took|Initializing model took|Loading weights took")),
    # torch.compile: compiled, or loaded from the cache (and an AOT artefact saved).
    ("compile", re.compile(r"torch\.compile (?:takes|took) [\d.]+ s in total")),
    # The profiling run and the KV cache's size.
    ("profile_kv_cache", re.compile(r"KV cache size:")),
    # Kernel warm-up and autotuning before the capture, then the CUDA-graph capture.
    ("capture", re.compile(r"Graph capturing finished")),
    # After the capture: vLLM runs the model and sampler once more to compile Triton's kernels
    # (kept in a cache per compile key), then the engine is up.
    ("post_capture_warmup", re.compile(r"init engine \(profile, create kv cache, warmup model\)")),
    # The API server learns the engine is up and starts listening.
    ("server_up", re.compile(r"Starting vLLM (?:API )?server on")),
)
STEPS_START = re.compile(r"non-default args")


# The folder of vLLM's torch.compile cache, named by its hash of the compile key (the config's
# hash, the traced code, the compiler and the environment): the same folder, the same compile.
COMPILE_KEY = re.compile(r"torch_compile_cache/([0-9a-f]+)/rank_")
# A compile served from that folder, and one compiled afresh (and then saved there). With
# vLLM's mega AOT artefact (VLLM_USE_MEGA_AOT_ARTIFACT) a hit loads the whole compiled model
# and logs only the AOT line (benchmarks/results/h100-start-ab/r1-sizes15-mega).
CACHE_HIT = re.compile(r"Directly load the compiled graph|Directly load AOT compilation from")
CACHE_MISS = re.compile(r"Compiling a graph for")


# vLLM's JIT monitor (0.26): armed once the engine's own warm-up is over, it logs a warning for a
# kernel compiled while serving ("Triton kernel JIT compilation during inference: NAME. This
# causes a latency spike"), once per kernel; the requests of that moment waited for it.
JIT_MONITOR = re.compile(r"Kernel JIT monitor activated")
LATE_JIT = re.compile(r"during inference: \S")


def late_compiles(text: str) -> int:
    """Kernels that vLLM's JIT monitor saw compiled while serving, in ``text`` (a log's part)."""
    return len(LATE_JIT.findall(text))


def late_compiles_by_phase(log: str, warmup: str, window: str) -> dict[str, float]:
    """``jit_compiles_warmup`` and ``jit_compiles_window``: kernels the JIT monitor saw compiled
    in ``warmup`` and in ``window``, the parts of the server's ``log`` from tuner's warm-up to its
    window and after; nothing where the log has no monitor (vLLM's CPU build, versions before
    0.26). One in the window made requests wait: the warm-up did not cover that shape."""
    if not JIT_MONITOR.search(log):
        return {}
    return {
        "jit_compiles_warmup": float(late_compiles(warmup)),
        "jit_compiles_window": float(late_compiles(window)),
    }


def find_markers(text: str) -> set[str]:
    """Which of vLLM's start-up log markers (``MARKERS``) the log text holds."""
    return {name for name, pattern in MARKERS.items() if pattern.search(text)}


def reported_durations(text: str) -> dict[str, float]:
    """vLLM's own figures; where a phase is reported several times (per worker), the largest."""
    out: dict[str, float] = {}
    for name, pattern in DURATIONS.items():
        values = [float(v) for v in pattern.findall(text)]
        if values:
            out[name] = max(values)
    return out


def _time_of(line_match: re.Match[str] | None, text: str) -> datetime | None:
    if line_match is None:
        return None
    line_start = text.rfind("\n", 0, line_match.start()) + 1
    line_end = text.find("\n", line_match.end())
    stamp = LOG_TIME.search(text, line_start, len(text) if line_end < 0 else line_end)
    # The year is not logged; a start over New Year's Eve is not worth a special case.
    return (
        None if stamp is None else datetime.strptime(f"2000-{stamp.group(1)}", "%Y-%m-%d %H:%M:%S")
    )


def steps(text: str) -> dict[str, float]:
    """``step_NAME_s``: the engine's start step by step (``STEPS``), from vLLM's log times.

    A step whose line a version does not print is left out and the next step found spans it
    (the CPU build compiles nothing and captures no graphs). Nothing before the API server's
    first line: the interpreter and imports are ``server_start_s`` of ``breakdown``.
    """
    previous = _time_of(STEPS_START.search(text), text)
    if previous is None:
        return {}
    out: dict[str, float] = {}
    for name, pattern in STEPS:
        at = _time_of(pattern.search(text), text)
        if at is not None and at >= previous:
            out[f"step_{name}_s"] = (at - previous).total_seconds()
            previous = at
    return out


def compile_cache(text: str) -> dict[str, str | bool]:
    """``compile_key`` (vLLM's cache folder name) and ``compile_cache_hit``, as far as the log
    says: nothing when the engine did not compile (``enforce-eager``, or no log yet)."""
    out: dict[str, str | bool] = {}
    key = COMPILE_KEY.search(text)
    if key:
        out["compile_key"] = key.group(1)
    if CACHE_MISS.search(text):
        out["compile_cache_hit"] = False
    elif CACHE_HIT.search(text):
        out["compile_cache_hit"] = True
    return out


def breakdown(seen_at_s: Mapping[str, float], log_text: str, healthy_s: float) -> dict[str, float]:
    """Start-up phases in seconds: the timeline from the markers, then vLLM's own durations.

    ``server_start_s``: launch until the API server has imported vLLM; ``engine_spawn_s``: from
    there until the engine-core process logs (its interpreter start and imports when spawned);
    ``engine_ready_s``: from there until the HTTP server listens (model load, profiling, KV
    cache, compile, graph capture); ``http_ready_s``: until ``/health`` answers. Then vLLM's
    own figures: ``model_load_s``, ``torch_compile_s`` (of which ``dynamo_s`` and
    ``graph_compile_s`` or ``graph_load_s``), ``cuda_graph_s`` (the capture), ``engine_init_s``
    and, from those, ``init_rest_s`` (profiling, KV cache and warm-up). Then the engine's
    steps from vLLM's log times (``steps``).
    """
    phases: dict[str, float] = {"healthy_s": healthy_s}
    previous = 0.0
    for marker, phase in (
        ("server_imported", "server_start_s"),
        ("engine_process", "engine_spawn_s"),
        ("server_listening", "engine_ready_s"),
    ):
        if marker in seen_at_s:
            phases[phase] = seen_at_s[marker] - previous
            previous = seen_at_s[marker]
    phases["http_ready_s"] = healthy_s - previous
    phases |= reported_durations(log_text)
    phases |= steps(log_text)
    parts = ("engine_init_s", "torch_compile_s", "cuda_graph_s")
    if all(p in phases for p in parts):
        # What vLLM's "init engine" took beyond compiling and capturing (profiling, the KV
        # cache, warm-up runs: benchmarks/results/h100-start-steps/), good to about a second.
        init_s, compile_s, capture_s = (phases[p] for p in parts)
        phases["init_rest_s"] = max(0.0, init_s - compile_s - capture_s)
    return phases
