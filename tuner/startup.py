"""Where an engine's start-up time goes, read from vLLM's log.

Pure. Two sources: markers (lines whose first appearance ``tuner.engine`` timestamps while it
waits for ``/health``), and the durations vLLM itself reports ("took 3.2 s"). Patterns cover
the CPU build (0.32) and the GPU release (0.26); a line that a version does not print simply
leaves its phase out.
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


def breakdown(seen_at_s: Mapping[str, float], log_text: str, healthy_s: float) -> dict[str, float]:
    """Start-up phases in seconds: the timeline from the markers, then vLLM's own durations.

    ``server_start_s``: launch until the API server has imported vLLM; ``engine_spawn_s``: from
    there until the engine-core process logs (its interpreter start and imports when spawned);
    ``engine_ready_s``: from there until the HTTP server listens (model load, profiling, KV
    cache, compile, graph capture); ``http_ready_s``: until ``/health`` answers.
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
    return phases
