"""Kernels compiled while serving: vLLM 0.26's JIT monitor logs each, and a trial records how many
came during tuner's warm-up and how many during its window (a window's kernel made requests
wait). Against the stand-in server (``tuner.testing.standin``), which logs the monitor's lines
at the request numbers it is given; the CPU build compiles no Triton kernel and has nothing to
log."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from conftest import cpu_spec, run_tuner, write_small_trace, write_spec

from tuner.cli.exits import MEETS_SLOS_EXITS
from tuner.engine.startup import late_compiles


def test_late_compiles_counts_the_monitors_kernel_lines():
    activated = (
        "INFO 11-23 18:46:36 [jit_monitor.py:79] Kernel JIT monitor activated; monitored JIT "
        "compilations during inference will use mode=warn."
    )
    compiled = (
        "WARNING 11-23 18:50:00 [jit_monitor.py:132] Triton kernel JIT compilation during "
        "inference: _topk_kernel. This causes a latency spike; consider extending warmup"
    )
    assert late_compiles(activated) == 0
    assert late_compiles("\n".join([activated, compiled, compiled])) == 2


@pytest.mark.vllm
@pytest.mark.parametrize("jit_at", ["2,7", ""])
def test_a_trial_records_kernels_compiled_in_its_warmup_and_its_window(
    tmp_path: Path, cpu_model: Path, stand_in_vllm: dict[str, str], jit_at: str
) -> None:
    spec = cpu_spec(cpu_model, window_s=2, time_scale=1, n_trials=1, warmup_requests=4)
    write_spec(tmp_path / "spec.yaml", spec)
    trace = write_small_trace(tmp_path / "trace.csv")
    storage = f"sqlite:///{tmp_path / 's.db'}"
    env = {**stand_in_vllm, "STAND_IN_JIT_AT": jit_at}
    args = ["run", "--trace", trace, "--study", "s", "--spec", tmp_path / "spec.yaml"]
    done = run_tuner(*args, "--storage", storage, cwd=tmp_path, env=env, timeout_s=180)
    assert done.returncode in MEETS_SLOS_EXITS, done.stdout + done.stderr
    (trial,) = optuna.load_study(study_name="s", storage=storage).trials
    attrs = trial.user_attrs
    if jit_at:
        # Request 2 is one of the 4 warm-up requests, request 7 is in the window.
        assert (attrs["jit_compiles_warmup"], attrs["jit_compiles_window"]) == (1.0, 1.0)
    else:
        # No monitor in the log (the CPU build, vLLM before 0.26): nothing recorded, not zeros.
        assert "jit_compiles_warmup" not in attrs and "jit_compiles_window" not in attrs
