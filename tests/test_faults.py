"""Faults that no handler sees: ``tuner run`` killed with SIGKILL in the middle of a trial.

The run starts the stand-in server (``tuner.testing.standin``, which like vLLM starts a worker
process and stops it on SIGTERM) with each launcher; the point is tuner's process handling and
the study's storage, not vLLM. Ctrl-C and SIGTERM on real vLLM are in ``test_run_e2e.py``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import optuna
import pytest
from conftest import (
    MARKER,
    cpu_spec,
    run_tuner,
    tuner_command,
    wait_for_no_processes,
    write_small_trace,
    write_spec,
)
from optuna.trial import TrialState

from tuner.cli.exits import EXIT_MISSES_SLOS, MEETS_SLOS_EXITS


def wait_for(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.mark.vllm
@pytest.mark.parametrize("launcher", ["process", "zygote"])
def test_sigkill_mid_trial_leaves_no_server_and_the_rerun_resumes(
    tmp_path: Path, cpu_model: Path, stand_in_vllm: dict[str, str], launcher: str
) -> None:
    """SIGKILL while trial 1 replays: its server and the server's worker (and the zygote) end
    within 10 s. The same command again marks trial 1 FAIL with the reason, keeps trial 0 (the
    baseline, not measured again) and runs its trials."""
    write_spec(tmp_path / "spec.yaml", cpu_spec(cpu_model, window_s=2, time_scale=1, n_trials=2))
    trace = write_small_trace(tmp_path / "trace.csv")
    storage = f"sqlite:///{tmp_path / 's.db'}"
    pids = tmp_path / "pids"
    pids.mkdir()
    marker = uuid.uuid4().hex
    env = {**stand_in_vllm, "STAND_IN_TOKEN_S": "0.05", "STAND_IN_PIDS": str(pids)}
    args = ["run", "--trace", trace, "--study", "s", "--spec", tmp_path / "spec.yaml"]
    args += ["--storage", storage, "--launcher", launcher]
    log = tmp_path / "runs" / "s" / "trial-0001" / "engine.log"
    with (tmp_path / "killed.out").open("wb") as out:
        proc = subprocess.Popen(
            tuner_command(*args),
            cwd=tmp_path,
            env={**os.environ, **env, MARKER: marker},
            stdout=out,
            stderr=out,
        )
    try:
        wait_for(
            lambda: log.exists() and "startup complete" in log.read_text(), 60, "trial 1's server"
        )
        time.sleep(1.0)  # into the window
        servers = [int(p.name) for p in pids.iterdir()]
        assert len(servers) == 4, servers  # trial 0's server and worker, then trial 1's
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=10) == -signal.SIGKILL
        began = time.monotonic()
        assert wait_for_no_processes(marker, timeout_s=10) == []
        gone_s = time.monotonic() - began
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    print(f"{launcher}: every process of the killed run gone {gone_s:.2f} s after the kill")

    (trial0, trial1) = optuna.load_study(study_name="s", storage=storage).trials
    assert trial0.state == TrialState.COMPLETE and trial1.state == TrialState.RUNNING

    again = run_tuner(*args, cwd=tmp_path, env=env, timeout_s=120)
    assert again.returncode in MEETS_SLOS_EXITS, again.stdout + again.stderr
    assert "trial 1: its tuner is gone (killed or crashed); marked failed" in again.stdout
    trials = optuna.load_study(study_name="s", storage=storage).trials
    states = [t.state for t in trials]
    assert states == [
        TrialState.COMPLETE,
        TrialState.FAIL,
        TrialState.COMPLETE,
        TrialState.COMPLETE,
    ]
    assert trials[0].datetime_complete == trial0.datetime_complete  # intact
    assert trials[1].user_attrs["reason"].startswith(f"tuner (pid {proc.pid}) ended while")
    assert [bool(t.user_attrs.get("baseline")) for t in trials] == [True, False, False, False]
    assert "trial   3" in again.stdout


@pytest.mark.vllm
def test_a_server_that_stops_streaming_costs_one_bounded_trial(
    tmp_path: Path, cpu_model: Path, stand_in_vllm: dict[str, str]
) -> None:
    """The baseline's server accepts every request and stops streaming after 2 tokens: each
    request fails once it has been silent for the spec's stall_timeout_s, the trial ends within
    that much after its window, recorded infeasible with the reason; the baseline is started
    once more, as bounded, and the study goes on. What serves is written unconfirmed (exit 3):
    no measurement of the baseline tested it."""
    spec = cpu_spec(cpu_model, window_s=2, time_scale=1, n_trials=3, stall_timeout_s=3)
    write_spec(tmp_path / "spec.yaml", spec)
    trace = write_small_trace(tmp_path / "trace.csv")
    storage = f"sqlite:///{tmp_path / 's.db'}"
    env = {**stand_in_vllm, "STAND_IN_STALL_AFTER": "2"}
    args = ["run", "--trace", trace, "--study", "s", "--spec", tmp_path / "spec.yaml"]
    done = run_tuner(*args, "--storage", storage, cwd=tmp_path, env=env, timeout_s=180)
    assert done.returncode == EXIT_MISSES_SLOS, done.stdout + done.stderr
    assert "not confirmed" in done.stdout, done.stdout
    *stalled_twice, served = optuna.load_study(study_name="s", storage=storage).trials
    for stalled in stalled_twice:
        assert stalled.user_attrs["baseline"]
        assert stalled.state == TrialState.COMPLETE and not stalled.user_attrs["feasible"]
        assert "stalled: nothing from the server for 3 s" in stalled.user_attrs["reason"]
        assert stalled.user_attrs["error_rate"] == 1.0
        # The window (2 s of arrivals) and one stall timeout, with room for a slow machine.
        assert stalled.user_attrs["time_window_s"] < 2 + 3 + 5
    assert len(stalled_twice) == 2
    assert served.user_attrs["feasible"] and served.user_attrs["error_rate"] == 0.0


LOST_INTERRUPT = """
import signal, sys, time
from tuner.cli.interrupts import deliver_lost_interrupts, raise_interrupt

signal.signal(signal.SIGTERM, raise_interrupt)
deliver_lost_interrupts()


class Lost:
    def __del__(self):
        raise KeyboardInterrupt  # as a signal landing in a handler os.fork runs: Python ignores it


try:
    Lost()
    time.sleep(20)
    print("went on")
except KeyboardInterrupt:
    print("interrupted")
"""


def test_an_interrupt_python_ignores_is_delivered_again(tmp_path: Path) -> None:
    """A Ctrl-C or SIGTERM that lands where Python cannot raise it (a fork's handler, a
    finalizer: seen as a ``tuner run --gpus`` worker that went on measuring after its SIGTERM)
    still stops tuner."""
    began = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", LOST_INTERRUPT], capture_output=True, text=True, timeout=60
    )
    assert done.stdout.strip() == "interrupted", done.stdout + done.stderr
    assert time.monotonic() - began < 15
