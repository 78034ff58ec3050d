"""Start-up phases read from vLLM's own logs: the GPU release (0.26) and the CPU build (0.32)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuner.engine.startup import (
    breakdown,
    compile_cache,
    find_markers,
    reported_durations,
    steps,
)

# An engine log of vLLM 0.26.0 on the H100, kept from a benchmark run (forked engine core).
LOGS = Path(__file__).parent / "data" / "engine-logs"
H100_LOG = LOGS / "h100-fork-1.log"
# Two engines of one A/B on the H100 (benchmarks/results/h100-capture/): max-num-seqs 32 with
# vLLM's capture range, compiled afresh, and with the range pinned, from the compile cache.
COMPILED_LOG = LOGS / "h100-capture-r0-s32-default.log"
CACHED_LOG = LOGS / "h100-capture-r0-s32-pinned.log"

# Lines of a CPU-build (0.32.0) engine log, from a test run of tuner.
CPU_LOG = """\
(APIServer pid=1794) INFO 11-22 03:43:45 [api_utils.py:286] non-default args: {'port': 49865}
(EngineCore pid=1874) INFO 11-22 03:43:59 [core.py:133] Initializing a V1 LLM engine (v0.32.0)
(Worker pid=2058) INFO 11-22 03:44:18 [base_loader.py:82] Initializing model took 0.660829 seconds
(APIServer pid=1794) INFO:     Application startup complete.
"""


def test_the_gpu_release_log_gives_every_phase():
    text = H100_LOG.read_text()
    assert find_markers(text) == {"server_imported", "engine_process", "server_listening"}
    assert reported_durations(text) == {
        "model_load_s": pytest.approx(2.216157),
        "torch_compile_s": pytest.approx(6.37),
        "cuda_graph_s": 1.0,
        "engine_init_s": pytest.approx(10.32),
        "dynamo_s": pytest.approx(3.86),
        "graph_load_s": pytest.approx(2.173),
    }


def test_the_cpu_build_log_gives_what_it_prints():
    assert find_markers(CPU_LOG) == {"server_imported", "engine_process", "server_listening"}
    assert reported_durations(CPU_LOG) == {"model_load_s": pytest.approx(0.660829)}


def test_breakdown_is_a_timeline_of_the_markers_seen():
    seen = {"server_imported": 0.5, "engine_process": 3.0, "server_listening": 17.5}
    phases = breakdown(seen, CPU_LOG, healthy_s=18.0)
    assert phases == {
        "healthy_s": 18.0,
        "server_start_s": 0.5,
        "engine_spawn_s": 2.5,
        "engine_ready_s": 14.5,
        "http_ready_s": pytest.approx(0.5),
        "model_load_s": pytest.approx(0.660829),
        "step_engine_process_s": 14.0,
        "step_model_load_s": 19.0,
    }
    # A marker a version does not print leaves its phase out; the next one spans both.
    assert "engine_spawn_s" not in breakdown({"server_imported": 1.0}, "", healthy_s=2.0)


def test_steps_of_an_engine_that_compiled():
    """vLLM's log times: 20 s after the capture (Triton kernels compiled for the new compile
    key) and 27 s of torch.compile, of which Dynamo 8 s and Inductor 11 s."""
    text = COMPILED_LOG.read_text()
    assert steps(text) == {
        "step_engine_process_s": 2.0,
        "step_worker_init_s": 2.0,
        "step_model_load_s": 2.0,
        "step_compile_s": 27.0,
        "step_profile_kv_cache_s": 3.0,
        "step_capture_s": 3.0,
        "step_post_capture_warmup_s": 20.0,
        "step_server_up_s": 1.0,
    }
    durations = reported_durations(text)
    assert durations["dynamo_s"] == pytest.approx(7.96)
    assert durations["graph_compile_s"] == pytest.approx(10.92)
    assert "graph_load_s" not in durations


def test_steps_of_an_engine_served_from_the_compile_cache():
    text = CACHED_LOG.read_text()
    found = steps(text)
    assert found["step_compile_s"] == 8.0 and found["step_post_capture_warmup_s"] == 1.0
    assert sum(found.values()) == 23.0
    assert reported_durations(text)["graph_load_s"] == pytest.approx(2.79)


def test_a_start_from_vllms_mega_aot_artefact_is_a_hit():
    # The start-up A/B on the H100 (benchmarks/results/h100-start-steps/): with
    # VLLM_USE_MEGA_AOT_ARTIFACT=1 a hit logs neither Dynamo's transform nor the per-range load,
    # only the AOT line; its miss compiled as usual.
    hit = (LOGS / "h100-start-r1-sizes15-mega.log").read_text()
    assert compile_cache(hit) == {"compile_cache_hit": True}
    assert steps(hit)["step_compile_s"] == 1.0 and "dynamo_s" not in reported_durations(hit)
    miss = compile_cache((LOGS / "h100-start-r0-sizes15-mega.log").read_text())
    assert miss == {"compile_key": "bbcfc90c2b", "compile_cache_hit": False}


def test_steps_skip_what_a_version_does_not_print():
    # The CPU build loads a model and compiles nothing: the time to the model load is one step.
    assert steps(CPU_LOG) == {"step_engine_process_s": 14.0, "step_model_load_s": 19.0}
    assert steps("no times here\nModel loading took 1 GiB and 2 seconds") == {}


def test_breakdown_includes_the_steps():
    phases = breakdown({}, CPU_LOG, healthy_s=40.0)
    assert phases["step_model_load_s"] == 19.0 and phases["healthy_s"] == 40.0
