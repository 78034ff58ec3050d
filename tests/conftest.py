"""Shared helpers: trace files written on the spot, study specs for the CPU build of vLLM.

Tests that start real vLLM servers carry ``@pytest.mark.vllm``; ``pytest -m "not vllm"`` runs
the rest in seconds.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tuner.engine.dummy_model import write_model

REPO = Path(__file__).resolve().parent.parent
SHIPPED_TRACE = REPO / "traces" / "azure-conv-peak.csv"

# Engine arguments that make the CPU build start in about half a minute.
CPU_ENGINE_ARGS = {"load-format": "dummy", "max-model-len": 4096, "enforce-eager": True}
CPU_BASELINE = {"gpu-memory-utilization": 0.2}


@pytest.fixture(scope="session", autouse=True)
def ctrl_c_raises():
    """Ctrl-C raises KeyboardInterrupt here and in every process the tests start.

    A job that a shell without job control starts in the background (``cmd &`` in a script,
    ``nohup cmd &``) inherits SIGINT ignored, and Python then leaves it ignored: the tests of
    Ctrl-C would see none. A handler, unlike an ignored signal, is reset to the default by
    ``exec``, so the tuner processes the tests start get Python's own handler too.
    """
    previous = signal.getsignal(signal.SIGINT)
    if previous == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.fixture
def write_trace(tmp_path: Path):
    """Write ``text`` byte for byte (no newline translation) and return its path."""

    def write(text: str, name: str = "trace.csv") -> Path:
        path = tmp_path / name
        path.write_bytes(text.encode())
        return path

    return write


@pytest.fixture(scope="session")
def cpu_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The ``cpu-demo`` dummy model folder, written once per session."""
    return write_model(tmp_path_factory.mktemp("model") / "cpu-demo", "cpu-demo")


def cpu_spec(model: Path, **overrides: Any) -> dict[str, Any]:
    """A study spec whose trials take about 50 s each on two CPU cores.

    The SLOs are loose: on a shared CI machine the point is to measure, not to miss them. The
    window's 19 prompts of 1,700 tokens on average queue behind each other's prefill: TTFT p95
    measured 118 to 136 s on a slow day of these 2-core machines (session 5), hence 600 s.
    """
    spec: dict[str, Any] = {
        "model": str(model),
        "dummy_model": None,
        "engine_args": dict(CPU_ENGINE_ARGS),
        "baseline": dict(CPU_BASELINE),
        "search_space": {
            "max-num-seqs": {"type": "int", "low": 1, "high": 32},
            "gpu-memory-utilization": {"type": "float", "low": 0.1, "high": 0.25, "step": 0.05},
        },
        "slos": {"ttft_p95_s": 600.0, "tpot_p95_s": 5.0, "e2e_p99_s": 900.0},
        "objective": {"ttft_p95_s": 1.0, "tpot_p95_s": 1.0, "e2e_p99_s": 1.0},
        "window_s": 2,
        "time_scale": 4,
        "health_timeout_s": 300,
        "n_trials": 3,
        # Pruning is tested where it is written; here every trial runs its whole window.
        "prune_factor": 0,
        # Re-measuring the winner likewise (test_confirm, test_capacity): here n_trials is all.
        "confirm_top_k": 0,
        # vLLM's CPU engine holds every process of these two cores, tuner's client included, for
        # up to seconds (benchmarks/results/cpu-client-lag.md); whether tuner flags a client
        # that fell behind is tested against a stand-in server (tests/test_spread.py).
        "client_tolerance_s": 60.0,
    }
    spec.update(overrides)
    return spec


def write_small_trace(path: Path) -> Path:
    """40 requests, one every 0.25 s (4 req/s over 10 s), prompts of 20 to 59 tokens and
    outputs of 10 to 49: a canonical CSV for tests that start no server."""
    rows = "".join(f"{0.25 * i},{20 + i},{10 + i}\n" for i in range(40))
    path.write_text("timestamp,input_tokens,output_tokens\n" + rows)
    return path


def write_spec(path: Path, spec: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def tuner_command(*args: str | Path) -> list[str]:
    return [sys.executable, "-m", "tuner.cli", *map(str, args)]


def run_tuner(
    *args: str | Path, cwd: Path, env: dict[str, str] | None = None, timeout_s: float = 900
) -> subprocess.CompletedProcess[str]:
    """``tuner ARGS`` as a subprocess, as a user would run it."""
    return subprocess.run(
        tuner_command(*args),
        cwd=cwd,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
