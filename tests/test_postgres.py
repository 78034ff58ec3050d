"""One study on a real PostgreSQL server, two ``tuner run`` workers at once (one per GPU, as
users spread trials), each starting the stand-in server (``tuner.testing.standin``).

The server is the ``postgres`` fixture's (conftest.py).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

import optuna
import pytest
import sqlalchemy.exc
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

from tuner.cli.exits import MEETS_SLOS_EXITS
from tuner.study.result.choice import choose

pytest.importorskip("psycopg")
pytestmark = pytest.mark.vllm


@pytest.fixture
def inputs(tmp_path: Path, cpu_model: Path) -> Path:
    spec = cpu_spec(cpu_model, window_s=2, time_scale=1, n_trials=3)
    spec["candidates"] = [{"max-num-seqs": 4}, {"max-num-seqs": 8}]
    write_spec(tmp_path / "spec.yaml", spec)
    write_small_trace(tmp_path / "trace.csv")
    return tmp_path


def worker(folder: Path, storage: str, study: str, env: dict[str, str], marker: str, *extra: str):
    """A ``tuner run`` on ``study`` (``extra``: more options); its output in
    ``worker-MARKER.out``."""
    args = ["run", "--trace", folder / "trace.csv", "--study", study, "--spec"]
    args += [folder / "spec.yaml", "--storage", storage, *extra]
    with (folder / f"worker-{marker}.out").open("wb") as out:
        return subprocess.Popen(
            tuner_command(*args),
            cwd=folder,
            env={**os.environ, **env, MARKER: marker},
            stdout=out,
            stderr=out,
        )


def study_trials(url: str, study: str) -> list[optuna.trial.FrozenTrial]:
    """The study's trials, read over a connection closed after: a test that polls would
    otherwise keep a pool of connections per read, past the server's ``max_connections``."""
    storage = optuna.storages.RDBStorage(url)
    try:
        return optuna.load_study(study_name=study, storage=storage).trials
    finally:
        storage.engine.dispose()


def second_trial_up(folder: Path, storage: str, study: str, pid: int) -> int | None:
    """The number of the worker's RUNNING trial once it has completed one and that trial's server
    has started; None before."""
    try:
        trials = study_trials(storage, study)
    except (KeyError, sqlalchemy.exc.SQLAlchemyError):
        return None  # the study, or Optuna's tables, not created yet (a worker is creating them)
    mine = [t for t in trials if t.user_attrs.get("worker", "").split(" ")[1:2] == [str(pid)]]
    running = [t.number for t in mine if t.state == TrialState.RUNNING]
    if not running or TrialState.COMPLETE not in [t.state for t in mine]:
        return None
    log = folder / "runs" / study / f"trial-{running[0]:04d}" / "engine.log"
    return running[0] if log.exists() and "stand-in vLLM pid=" in log.read_text() else None


def test_two_workers_share_one_study(
    inputs: Path, postgres: str, stand_in_vllm: dict[str, str]
) -> None:
    """Two workers of 3 trials each, started together: both add trials, no trial number runs
    twice, the baseline and each candidate are measured once in all, and the YAML is the best
    trial over both."""
    study = f"shared-{uuid.uuid4().hex[:8]}"
    env = {**stand_in_vllm, "STAND_IN_TOKEN_S": "0.01"}
    markers = [uuid.uuid4().hex, uuid.uuid4().hex]
    procs = [worker(inputs, postgres, study, env, marker) for marker in markers]
    for proc, marker in zip(procs, markers, strict=True):
        output = (inputs / f"worker-{marker}.out").read_text
        assert proc.wait(timeout=300) in MEETS_SLOS_EXITS, output()
        assert wait_for_no_processes(marker) == []
    trials = study_trials(postgres, study)
    measured = [t for t in trials if t.state == TrialState.COMPLETE]
    dropped = [t for t in trials if t.state != TrialState.COMPLETE]
    assert len(measured) == 6
    assert all("queued twice by two workers" in t.user_attrs["reason"] for t in dropped)
    assert len({t.user_attrs["worker"] for t in measured}) == 2
    assert sorted(t.number for t in trials) == list(range(len(trials)))
    logs = sorted((inputs / "runs" / study).glob("trial-*/engine.log"))
    assert [log.parent.name for log in logs] == [f"trial-{t.number:04d}" for t in measured]
    assert all(log.read_text().count("stand-in vLLM pid=") == 1 for log in logs)
    assert sum(bool(t.user_attrs.get("baseline")) for t in measured) == 1
    assert sorted(t.user_attrs["candidate"] for t in measured if "candidate" in t.user_attrs) == [
        0,
        1,
    ]
    # The configuration the shared study chose (vLLM's defaults unless a searched one beat
    # them beyond the spread) is the one a worker wrote.
    chosen = choose(optuna.load_study(study_name=study, storage=postgres))
    assert chosen is not None
    assert (
        f"Study '{study}', trial {chosen.trial.number}."
        in (inputs / "configs" / f"{study}.yaml").read_text()
    )


def test_a_worker_killed_mid_trial_leaves_the_other_running(
    inputs: Path, postgres: str, stand_in_vllm: dict[str, str]
) -> None:
    """SIGKILL to one worker as a later trial's server is up: the other finishes its trials
    and exits 0; the killed worker's trial stays RUNNING (its worker may be on another machine)
    until a run on this machine marks it FAIL.

    The worker to be killed streams slower (its trials' servers are up 5 s or more) and has more
    trials than the other: on a loaded 2-core machine, where each look at the study took seconds,
    it had run all its trials of about 3 s each unseen and exited before the kill."""
    study = f"kill-{uuid.uuid4().hex[:8]}"
    env = {**stand_in_vllm, "STAND_IN_TOKEN_S": "0.05"}
    victim, survivor = uuid.uuid4().hex, uuid.uuid4().hex
    slow = {**env, "STAND_IN_TOKEN_S": "0.3"}
    killed = worker(inputs, postgres, study, slow, victim, "--n-trials", "8")
    time.sleep(1.0)
    other = worker(inputs, postgres, study, env, survivor)
    try:
        # The survivor has opened the study (so it looks for orphans only before the kill), and
        # the victim runs its second trial with the server up: read from the study and the trial's
        # engine log, not from printed lines, which a slow machine orders differently.
        deadline = time.monotonic() + 180
        survivor_out = inputs / f"worker-{survivor}.out"
        while (target := second_trial_up(inputs, postgres, study, killed.pid)) is None or (
            "trials so far" not in survivor_out.read_text()
        ):
            said = (inputs / f"worker-{victim}.out").read_text() + survivor_out.read_text()
            assert time.monotonic() < deadline and killed.poll() is None, said
            time.sleep(0.2)
        killed.send_signal(signal.SIGKILL)
        killed.wait(timeout=10)
        assert wait_for_no_processes(victim) == []
        assert other.wait(timeout=300) in MEETS_SLOS_EXITS, (
            inputs / f"worker-{survivor}.out"
        ).read_text()
    finally:
        for proc in (killed, other):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    trials = study_trials(postgres, study)
    pid = str(other.pid)
    theirs = [t for t in trials if t.user_attrs.get("worker", "").split(" ")[1] == pid]
    assert [t.state for t in theirs] == [TrialState.COMPLETE] * 3
    running = [t for t in trials if t.state == TrialState.RUNNING]
    assert [t.number for t in running] == [target]
    assert running[0].user_attrs["worker"].split(" ")[1] == str(killed.pid)
    after = run_tuner(*["run", "--trace", inputs / "trace.csv", "--study", study, "--spec"],
                      inputs / "spec.yaml", "--storage", postgres, "--n-trials", "0",
                      cwd=inputs, env=env, timeout_s=120)  # fmt: skip
    assert f"trial {running[0].number}: its tuner is gone" in after.stdout, after.stderr
    trials = study_trials(postgres, study)
    assert TrialState.RUNNING not in [t.state for t in trials]


def test_a_storage_password_is_in_no_file_a_run_writes(
    inputs: Path, postgres: str, stand_in_vllm: dict[str, str]
) -> None:
    """A whole run and its report on a storage URL with a password (the server trusts local
    users, so any password is accepted): the password is on no line of stdout or stderr, in no
    file the run or ``tuner report`` wrote, and in none of the study's attributes."""
    secret = "Pw-" + uuid.uuid4().hex[:12]
    user, rest = postgres.removeprefix("postgresql://").split("@", 1)
    storage = f"postgresql://{user}:{secret}@{rest}"
    study = f"secret-{uuid.uuid4().hex[:8]}"
    env = {**stand_in_vllm, "STAND_IN_TOKEN_S": "0.01"}
    marker = uuid.uuid4().hex
    proc = worker(inputs, storage, study, env, marker, "--n-trials", "2")
    assert proc.wait(timeout=300) in MEETS_SLOS_EXITS
    report = run_tuner(
        "report", study, "--storage", storage, "--out", inputs / "reports", cwd=inputs
    )
    assert report.returncode == 0, report.stdout + report.stderr
    assert secret not in report.stdout + report.stderr
    written = [p for p in inputs.rglob("*") if p.is_file()]
    assert any(p.suffix == ".html" for p in written) and any(p.suffix == ".yaml" for p in written)
    holding = [p for p in written if secret.encode() in p.read_bytes()]
    assert holding == []
    loaded = optuna.load_study(study_name=study, storage=postgres)
    attrs = [loaded.user_attrs, *(t.user_attrs for t in loaded.trials)]
    assert all(secret not in repr(a) for a in attrs)
