"""Where an engine's start-up time goes, read from vLLM's log.

Pure. Two sources: markers (lines whose first appearance ``tuner.engine.process`` timestamps
while it waits for ``/health``), and the durations vLLM itself reports ("took 3.2 s"). Patterns
cover the CPU build (0.32) and the GPU release (0.26); a line that a version does not print
simply leaves its phase out.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

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
}


# The folder of vLLM's torch.compile cache, named by its hash of the compile key (the config's
# hash, the traced code, the compiler and the environment): the same folder, the same compile.
COMPILE_KEY = re.compile(r"torch_compile_cache/([0-9a-f]+)/rank_")
# A compile served from that folder, and one compiled afresh (and then saved there).
CACHE_HIT = re.compile(r"Directly load the compiled graph")
CACHE_MISS = re.compile(r"Compiling a graph for")


def find_markers(text: str) -> set[str]:
    return {name for name, pattern in MARKERS.items() if pattern.search(text)}


def reported_durations(text: str) -> dict[str, float]:
    """vLLM's own figures; where a phase is reported several times (per worker), the largest."""
    out: dict[str, float] = {}
    for name, pattern in DURATIONS.items():
        values = [float(v) for v in pattern.findall(text)]
        if values:
            out[name] = max(values)
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
    own figures: ``model_load_s``, ``torch_compile_s``, ``cuda_graph_s`` (the capture),
    ``engine_init_s`` and, from those, ``init_rest_s`` (profiling, KV cache and warm-up).
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
    parts = ("engine_init_s", "torch_compile_s", "cuda_graph_s")
    if all(p in phases for p in parts):
        # What vLLM's "init engine" took beyond compiling and capturing: profiling, the KV
        # cache and warm-up runs, which vLLM does not time apart (on the H100 mostly a warm-up
        # after the capture, itself cached per compile key). The capture is logged in whole
        # seconds, so this is good to about a second.
        init_s, compile_s, capture_s = (phases[p] for p in parts)
        phases["init_rest_s"] = max(0.0, init_s - compile_s - capture_s)
    return phases
