"""A trial's lease: a worker killed on another host has its trial failed by a worker here, once
the lease it stopped renewing runs out.

Two processes share only the study's storage (a SQLite file; PostgreSQL in the slow tier): a
worker that names its host ``elsewhere`` (``TUNER_WORKER_HOST``) measures a trial with a runner
that never ends, under a lease of ``LEASE_S``; it is killed with SIGKILL, and a second process,
on this machine's own host name, opens the study as ``tuner run`` does (``open_study``, then
``fail_orphans``) until the trial is failed. The journal file and PostgreSQL, whose processes
take a few seconds more, are in the slow tier.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState
from test_search import SPEC, stand_in_setup
from test_storage_race import fresh_databases

from tuner.study.plan.spec import parse_spec
from tuner.study.store.record import LEASE_ATTR, REASON_ATTR, WORKER_ATTR, TrialRecord
from tuner.study.store.storage import storage_of
from tuner.study.trials.lease import Lease, expired
from tuner.study.trials.search import open_study, run_study
from tuner.study.trials.workers import HOST_ENV, fail_orphans

LEASE_S = 1.5

# argv: the storage URL, the lease's seconds. Says "measuring" once the trial runs, then never
# ends: only SIGKILL stops it.
WORKER = """
import sys, time
from dataclasses import replace
from test_search import SPEC, stand_in_setup
from tuner.study.plan.spec import parse_spec
from tuner.study.trials.search import open_study, run_study
from tuner.study.store.storage import storage_of

def forever(args, setup, workdir, should_stop=None):
    print("measuring", flush=True)
    while True:
        time.sleep(1)

spec = replace(parse_spec(SPEC), lease_s=float(sys.argv[2]))
run_study(open_study("s", sys.argv[1], 0), spec, stand_in_setup(), __import__("pathlib").Path("."),
          1, runner=forever)
"""

# argv: the storage URL. Opens the study as ``tuner run`` does and says which trials it failed.
OPENER = """
import sys
from tuner.study.trials.search import open_study
from tuner.study.trials.workers import fail_orphans
study = open_study("s", sys.argv[1], 0)
print([t.number for t in fail_orphans(study)], flush=True)
"""


def python(script: str, *argv: str, env: dict[str, str] | None = None, **kw):
    tests = str(Path(__file__).parent)
    path = os.pathsep.join([tests, os.environ.get("PYTHONPATH", "")])
    environ = {**os.environ, "PYTHONPATH": path, **(env or {})}
    return subprocess.Popen([sys.executable, "-c", script, *argv], env=environ, text=True, **kw)


def opened(url: str) -> str:
    proc = python(OPENER, url, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    return out.strip()


def the_trial(url: str) -> optuna.trial.FrozenTrial:
    (trial,) = optuna.load_study(study_name="s", storage=storage_of(url)).trials
    return trial


def killed_elsewhere_is_failed_here(url: str, tmp_path: Path) -> None:
    worker = python(
        WORKER, url, str(LEASE_S), env={HOST_ENV: "elsewhere"}, cwd=tmp_path,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert worker.stdout is not None
        assert worker.stdout.readline().strip() == "measuring", worker.stderr
        first = the_trial(url).user_attrs[LEASE_ATTR]
        # Renewed while the worker lives: past its first lease, the trial is its still.
        time.sleep(LEASE_S * 1.2)
        assert opened(url) == "[]"
        running = the_trial(url)
        assert running.state == TrialState.RUNNING
        assert running.user_attrs[LEASE_ATTR] > first
        assert running.user_attrs[WORKER_ATTR].startswith("elsewhere/")
        worker.send_signal(signal.SIGKILL)
        worker.wait(timeout=10)
        killed_at = time.time()
    finally:
        with worker:  # its pipes closed once it has exited
            if worker.poll() is None:
                worker.kill()
    # The worker's host is not this one: only its lease can tell that it is gone.
    # Each opening is another process (seconds on a busy machine): when each began, and what
    # it failed.
    openings: list[tuple[float, str]] = []
    while not openings or openings[-1][1] == "[]":
        assert time.time() < killed_at + LEASE_S + 60, "the trial was never failed"
        began = time.time()
        openings.append((began, opened(url)))
        time.sleep(0.2)
    assert openings[-1][1] == "[0]"
    trial = the_trial(url)
    assert trial.state == TrialState.FAIL
    assert "stopped renewing this trial's lease" in trial.user_attrs[REASON_ATTR]
    assert "on elsewhere" in trial.user_attrs[REASON_ATTR]
    lease_until = trial.user_attrs[LEASE_ATTR]
    # The lease the worker last renewed runs out within a lease of the kill; the trial was
    # failed after it ran out, never before, and by the first opening to begin after it (an
    # opening that left it began while the lease held, whatever the time its process took).
    assert lease_until <= killed_at + LEASE_S + 0.5
    assert trial.datetime_complete is not None
    assert trial.datetime_complete.timestamp() >= lease_until
    assert all(began < lease_until for began, _ in openings[:-1])


@pytest.mark.vllm  # a stand-in server's windows, waited out in real time
def test_a_worker_killed_on_another_host_has_its_trial_failed_once_its_lease_runs_out(
    tmp_path: Path,
) -> None:
    killed_elsewhere_is_failed_here(f"sqlite:///{tmp_path / 's.db'}", tmp_path)


@pytest.mark.vllm
def test_the_lease_holds_on_postgresql_too(postgres: str, tmp_path: Path) -> None:
    (url,) = fresh_databases(postgres, 1)
    killed_elsewhere_is_failed_here(url, tmp_path)


@pytest.mark.vllm
def test_the_journal_storage_holds_the_lease_too(tmp_path: Path) -> None:
    killed_elsewhere_is_failed_here(f"journal:{tmp_path / 's.log'}", tmp_path)


def test_a_worker_that_finishes_a_trial_fails_a_trial_whose_lease_ran_out(
    tmp_path: Path,
) -> None:
    """A trial of another host left RUNNING with a lease past is failed by a worker here as
    soon as that worker finishes a trial, not only when a run opens the study."""
    storage = f"sqlite:///{tmp_path / 's.db'}"
    study = open_study("s", storage, 0)
    left = study.ask()
    left.set_user_attr(WORKER_ATTR, "elsewhere/boot 123 456")
    left.set_user_attr(LEASE_ATTR, time.time() - 1.0)

    def quick(args, setup, workdir, should_stop=None):
        from test_search import Reporting

        return Reporting()(args, setup, workdir)

    run_study(study, parse_spec(SPEC), stand_in_setup(), tmp_path, 1, runner=quick)
    trials = optuna.load_study(study_name="s", storage=storage).trials
    assert trials[0].state == TrialState.FAIL
    assert "stopped renewing this trial's lease" in trials[0].user_attrs[REASON_ATTR]
    assert trials[1].state == TrialState.COMPLETE
    assert TrialRecord.of(trials[1]).lease_until is not None


def test_a_lease_is_past_only_after_its_time_and_a_trial_without_one_never_is(
    tmp_path: Path,
) -> None:
    study = open_study("s", f"sqlite:///{tmp_path / 's.db'}", 0)
    trial = study.ask()
    trial.set_user_attr(WORKER_ATTR, "elsewhere/boot 123 456")
    assert expired(TrialRecord.of(study.trials[0]), now=time.time()) is None
    with Lease(study, trial, lease_s=600.0, clock=lambda: 1000.0):
        pass
    recorded = TrialRecord.of(study.trials[0])
    assert recorded.lease_until == 1600.0
    assert expired(recorded, now=1600.0) is None
    assert "(pid 123) on elsewhere" in (expired(recorded, now=1600.5) or "")
    assert fail_orphans(study, now=1599.0) == []
    assert [t.number for t in fail_orphans(study, now=1601.0)] == [0]
