"""Start-up phases read from vLLM's own logs: the GPU release (0.26) and the CPU build (0.32)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuner.engine.startup import breakdown, find_markers, reported_durations

# An engine log of vLLM 0.26.0 on the H100, kept from a benchmark run (forked engine core).
H100_LOG = Path(__file__).parent.parent / "benchmarks/results/h100-fork/fork-1.engine.log"

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
    }
    # A marker a version does not print leaves its phase out; the next one spans both.
    assert "engine_spawn_s" not in breakdown({"server_imported": 1.0}, "", healthy_s=2.0)
