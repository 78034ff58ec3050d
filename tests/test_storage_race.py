"""Workers started together all open their study: 4 processes released at one instant, 10 times
in a row, each time on a fresh database, on PostgreSQL (the ``postgres`` fixture's server) and on
SQLite; then a study holding a trial whose tuner is gone, which each worker looks for on opening.

Each worker is a Python process that imports tuner once and then, round after round, waits on
the round's pipe and opens the study with ``open_study`` (and ``fail_orphans``, as ``tuner run``
does). The pipe's write end is closed once every worker waits on it: all of them wake from the
same end of file.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import optuna
import pytest
import sqlalchemy
from optuna.trial import TrialState

from tuner.errors import TunerError
from tuner.study.setup.objective import SCORE_NAME
from tuner.study.store.record import REASON_ATTR, WORKER_ATTR
from tuner.study.store.storage import PG_OPEN_LOCK, SQLITE_LOCK_SUFFIX
from tuner.study.trials.search import open_study
from tuner.study.trials.workers import this_worker

pytestmark = pytest.mark.vllm

WORKERS = 4
ROUNDS = 10
ORPHAN_ROUNDS = 3

# argv: the study's name, then a read end and a storage URL for each round.
WORKER = """
import os, sys
from tuner.study.trials.search import open_study
from tuner.study.trials.workers import fail_orphans

name, rounds = sys.argv[1], sys.argv[2:]
for i, (fd, url) in enumerate(zip(rounds[::2], rounds[1::2])):
    print(f"ready {i}", flush=True)
    while os.read(int(fd), 1):
        pass
    try:
        study = open_study(name, url, 0)
        marked = [t.number for t in fail_orphans(study)]
        said = f"opened {len(study.trials)} trials, marked {marked}"
        study._storage._backend.engine.dispose()  # a server allows so many connections
    except Exception as exc:
        said = "failed: " + " | ".join(f"{type(exc).__name__}: {exc}".splitlines())
    print(f"round {i} {said}", flush=True)
"""


def open_together(urls: list[str], name: str, folder: Path) -> list[list[str]]:
    """Start ``WORKERS`` workers, release them on ``urls[0]``, then ``urls[1]``, ...; return
    what each worker said in each round (a list per round)."""
    pipes = [os.pipe() for _ in urls]
    argv = [sys.executable, "-c", WORKER, name]
    for (read, _), url in zip(pipes, urls, strict=True):
        argv += [str(read), url]
    logs = [folder / f"worker-{n}.err" for n in range(WORKERS)]
    procs = []
    try:
        for log in logs:
            with log.open("w") as err:
                procs.append(
                    subprocess.Popen(
                        argv,
                        pass_fds=[read for read, _ in pipes],
                        stdout=subprocess.PIPE,
                        stderr=err,
                        text=True,
                    )
                )
        for read, _ in pipes:
            os.close(read)
        said = []
        for i, (_, write) in enumerate(pipes):
            for proc, log in zip(procs, logs, strict=True):
                line = next_line(proc)
                assert line == f"ready {i}", f"{line!r}; stderr: {log.read_text()}"
            os.close(write)  # every worker wakes from its read at once
            said.append([next_line(proc).removeprefix(f"round {i} ") for proc in procs])
        for proc, log in zip(procs, logs, strict=True):
            assert proc.wait(timeout=60) == 0, log.read_text()
        return said
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for _, write in pipes:
            with contextlib.suppress(OSError):  # closed above
                os.close(write)


def next_line(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    return proc.stdout.readline().rstrip("\n")


def fresh_databases(postgres: str, n: int) -> Iterator[str]:
    """``n`` new, empty databases on the fixture's server."""
    engine = sqlalchemy.create_engine(postgres, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as connection:
            for _ in range(n):
                database = f"race_{uuid.uuid4().hex[:12]}"
                connection.execute(sqlalchemy.text(f"CREATE DATABASE {database}"))
                url = sqlalchemy.make_url(postgres).set(database=database)
                yield url.render_as_string(hide_password=False)
    finally:
        engine.dispose()


@pytest.fixture(params=["postgresql", "sqlite"])
def fresh_urls(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[int], list[str]]:
    """Storage URLs of ``n`` databases that do not hold anything yet, of the param's kind."""

    def make(n: int) -> list[str]:
        if request.param == "sqlite":
            return [f"sqlite:///{tmp_path / f'study-{i}.db'}" for i in range(n)]
        return list(fresh_databases(request.getfixturevalue("postgres"), n))

    return make


def test_workers_started_together_all_open_the_study(
    fresh_urls: Callable[[int], list[str]], tmp_path: Path
) -> None:
    """4 workers at once, 10 times on a new database: Optuna's tables, its schema version, the
    study and its objective's name are made once, and every worker opens the study. Then 3 times
    on a study holding a RUNNING trial of a tuner that is gone: every worker opens it and the
    trial is marked FAIL, a worker that finds it marked by another leaving it be."""
    urls = fresh_urls(ROUNDS + ORPHAN_ROUNDS)
    for url in urls[ROUNDS:]:
        orphan = open_study("s", url, 0).ask()
        machine = this_worker().split(" ")[0]
        orphan.set_user_attr(WORKER_ATTR, f"{machine} 4194305 1")  # above Linux's highest pid
    said = open_together(urls, "s", tmp_path)
    failures = [
        f"round {i}: {line}"
        for i, lines in enumerate(said)
        for line in lines
        if "opened" not in line
    ]
    assert not failures, "\n".join(failures)
    assert said[:ROUNDS] == [["opened 0 trials, marked []"] * WORKERS] * ROUNDS
    for url in urls[:ROUNDS]:
        (summary,) = optuna.get_all_study_summaries(url)
        assert summary.study_name == "s"
        assert optuna.load_study(study_name="s", storage=url).metric_names == [SCORE_NAME]
    # Optuna checks a trial is RUNNING and then finishes it, in one transaction on PostgreSQL
    # but not on SQLite: there two workers may both mark it, to the same effect.
    for round_said in said[ROUNDS:]:
        assert set(round_said) <= {"opened 1 trials, marked []", "opened 1 trials, marked [0]"}
        assert "opened 1 trials, marked [0]" in round_said
    for url in urls[ROUNDS:]:
        (trial,) = optuna.load_study(study_name="s", storage=url).trials
        assert trial.state == TrialState.FAIL
        assert "ended while this trial ran" in trial.user_attrs[REASON_ATTR]


def test_opening_waits_its_turn_then_fails_in_one_line(postgres: str, tmp_path: Path) -> None:
    """A turn held elsewhere (another tuner stuck while opening) makes ``open_study`` wait
    ``wait_s``, then fail naming the storage; once released, the study opens."""
    (pg_url,) = fresh_databases(postgres, 1)
    db = tmp_path / "s.db"
    engine = sqlalchemy.create_engine(pg_url, poolclass=sqlalchemy.pool.NullPool)
    with engine.connect() as connection, (tmp_path / f"s.db{SQLITE_LOCK_SUFFIX}").open("a") as f:
        connection.execute(sqlalchemy.text(f"SELECT pg_advisory_lock({PG_OPEN_LOCK})"))
        fcntl.flock(f, fcntl.LOCK_EX)
        for url in (pg_url, f"sqlite:///{db}"):
            with pytest.raises(TunerError) as raised:
                open_study("s", url, 0, wait_s=0.5)
            assert str(raised.value) == (
                f"cannot open the study storage {url}: other tuner processes were opening a "
                "study there for over 0.5 s"
            )
    engine.dispose()
    for url in (pg_url, f"sqlite:///{db}"):
        assert open_study("s", url, 0, wait_s=0.5).study_name == "s"
