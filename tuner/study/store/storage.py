"""The study's storage as tuner speaks of it: its URL without a password, its failures in a line.

Optuna keeps a study in a database through SQLAlchemy; what goes wrong there (a URL it cannot
parse, a driver not installed, a server not listening, a SQLite file in a folder that does not
exist, a database that stops taking writes) reaches tuner as an exception of SQLAlchemy's or
Optuna's, with a message over several lines. These are failures of the tool's surroundings:
tuner reports them in one line, naming the storage and the cause.

Several tuner processes may open one study at the same moment (one worker per GPU, started
together). Opening creates Optuna's tables on a new database, stamps its schema version, creates
the study and names its objective, each a check followed by a write that a second process can
slip between. ``opening`` makes the processes take turns: on PostgreSQL a session-level advisory
lock of the database, on SQLite an exclusive lock of a file beside the database.

Besides SQLAlchemy's URLs, ``journal:PATH`` names Optuna's journal storage in the file PATH
(``JournalStorage`` over a ``JournalFileBackend``): an append-only log that many processes of
one host write at once, each under the file's own lock; ``tuner run --gpus`` keeps its study
there unless ``--storage`` says otherwise.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, cast

import optuna
import sqlalchemy
from optuna.storages.journal import JournalFileBackend
from optuna.trial import Trial, TrialState

from tuner.errors import InputError, TunerError
from tuner.study.store import record
from tuner.urls import shown_text, shown_url

logger = logging.getLogger(__name__)


class OpeningTimeout(Exception):
    """Other tuner processes were opening a study in the same database for too long."""


# What opening or writing to a storage raises when the storage, not tuner, is at fault.
STORAGE_ERRORS: tuple[type[Exception], ...] = (
    sqlalchemy.exc.SQLAlchemyError,
    optuna.exceptions.StorageInternalError,
)
# Opening also imports the database's driver, which may not be installed, and opens a journal
# file, which may be in a folder that is missing or not writable.
OPEN_ERRORS: tuple[type[Exception], ...] = (
    *STORAGE_ERRORS, ImportError, OpeningTimeout, OSError,
)  # fmt: skip

# The prefix of a journal storage's URL: ``journal:PATH``.
JOURNAL = "journal:"

# Seconds a PostgreSQL server may take to accept a connection: one that takes it and never
# answers (a firewall's black hole, a server stuck in recovery) would otherwise hold tuner.
CONNECT_TIMEOUT_S = 10

# Seconds a tuner process waits for others to finish opening a study in the same database.
# Opening is a few statements; a process that holds the turn for minutes is stuck.
OPEN_WAIT_S = 120.0

# PostgreSQL's advisory locks are numbers, scoped to a database; tuner's turn to open is this one.
PG_OPEN_LOCK = int.from_bytes(b"tuner-op", "big")

# SQLite's own locks are POSIX record locks on the database file, which a process loses when it
# closes any descriptor of that file; tuner's lock is on a file of its own, kept beside it.
SQLITE_LOCK_SUFFIX = ".open-lock"

# The line SQLAlchemy adds to its messages.
_BACKGROUND = re.compile(r"\(Background on this error at: [^)]*\)")


def cause(exc: BaseException) -> str:
    """What went wrong, in one line: the database's own words where it said something.

    Optuna wraps SQLAlchemy's error in a general message of its own, and SQLAlchemy the
    database driver's, adding the statement and a link; the driver's message is the one that
    names the cause (``database is locked``, ``connection refused``).
    """
    if isinstance(exc, optuna.exceptions.StorageInternalError) and exc.__cause__ is not None:
        exc = exc.__cause__
    if isinstance(exc, ImportError):
        driver = exc.__cause__ if isinstance(exc.__cause__, ImportError) else exc
        return f"its database driver is not installed ({driver})"
    said = getattr(exc, "orig", None) or exc
    return " ".join(_BACKGROUND.sub("", str(said)).split()) or type(said).__name__


def _engine_kwargs(url: str) -> dict[str, object]:
    """SQLAlchemy engine arguments: a PostgreSQL server gets ``CONNECT_TIMEOUT_S`` to answer."""
    if sqlalchemy.make_url(url).get_backend_name() == "postgresql":
        return {"connect_args": {"connect_timeout": CONNECT_TIMEOUT_S}}
    return {}


def journal_path(url: str) -> Path | None:
    """The file of a ``journal:PATH`` storage; None for any other URL."""
    return Path(url.removeprefix(JOURNAL)) if url.startswith(JOURNAL) else None


class FlockJournalLock:
    """A journal file's lock: an exclusive ``flock`` of the file ``PATH.lock`` beside it, which
    the kernel releases when the process holding it dies. Optuna's own locks (a symlink, a file
    made exclusively) are taken from a dead holder only after a grace period of 30 s: a worker
    killed while it wrote would hold every other worker of the host up that long.

    ``JournalFileBackend`` calls only ``acquire`` and ``release``; the base class it names for
    its lock is not part of Optuna's public API, so this one is typed against none."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._held: IO[str] | None = None

    def acquire(self) -> bool:
        handle = self._path.open("a")
        fcntl.flock(handle, fcntl.LOCK_EX)
        self._held = handle
        return True

    def release(self) -> None:
        held, self._held = self._held, None
        if held is not None:
            held.close()  # closing the file releases the lock


def storage_of(url: str) -> optuna.storages.BaseStorage:
    """The storage ``url`` names: a journal file (``journal:PATH``, under ``FlockJournalLock``)
    or a database (``rdb_storage``, inside ``opening`` where another tuner may open it at
    once)."""
    path = journal_path(url)
    if path is not None:
        lock = FlockJournalLock(Path(f"{path}.lock"))
        backend = JournalFileBackend(str(path), lock_obj=cast(Any, lock))
        return optuna.storages.JournalStorage(backend)
    return rdb_storage(url)


def dashboard_target(url: str) -> str:
    """What ``optuna-dashboard`` is given to show the study: a journal's file, else the URL
    (its password masked)."""
    path = journal_path(url)
    return str(path) if path is not None else shown_url(url)


def rdb_storage(url: str) -> optuna.storages.RDBStorage:
    """The storage at ``url``, its tables created if the database has none.

    Creating them is not safe against another process doing so at once: call it inside
    ``opening(url)`` where another tuner may open the same database.
    """
    return optuna.storages.RDBStorage(url, engine_kwargs=_engine_kwargs(url))


@contextlib.contextmanager
def opening(url: str, wait_s: float = OPEN_WAIT_S) -> Iterator[None]:
    """Hold this database's turn to open a study: one tuner process at a time.

    On PostgreSQL, the advisory lock ``PG_OPEN_LOCK`` on a connection of its own, which the
    server releases if the process dies; on a SQLite file, an exclusive ``flock`` of the file
    ``DATABASE.open-lock`` beside it (made if missing, never removed: another process may be
    waiting on it), released by the kernel likewise. Other databases are opened without a turn.

    A journal file takes turns likewise, under ``PATH.open-lock``.

    Raises ``OpeningTimeout`` after ``wait_s`` seconds of waiting, and SQLAlchemy's errors (or
    ``ImportError``) where the PostgreSQL server cannot be reached (or its driver is missing).
    """
    journal = journal_path(url)
    if journal is not None:
        with _file_turn(Path(str(journal) + SQLITE_LOCK_SUFFIX), wait_s):
            yield
        return
    parsed = sqlalchemy.make_url(url)
    backend = parsed.get_backend_name()
    if backend == "postgresql":
        with _pg_turn(url, wait_s):
            yield
    elif backend == "sqlite" and parsed.database not in (None, "", ":memory:"):
        database = str(parsed.database)
        with _file_turn(Path(database + SQLITE_LOCK_SUFFIX), wait_s):
            yield
    else:
        yield


def _waited_too_long(wait_s: float) -> OpeningTimeout:
    return OpeningTimeout(f"other tuner processes were opening a study there for over {wait_s:g} s")


@contextlib.contextmanager
def _pg_turn(url: str, wait_s: float) -> Iterator[None]:
    engine = sqlalchemy.create_engine(
        url, poolclass=sqlalchemy.pool.NullPool, **_engine_kwargs(url)
    )
    try:
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
            # The lock is the session's, held across statements; lock_timeout bounds the wait.
            connection.execute(sqlalchemy.text(f"SET lock_timeout = {round(wait_s * 1000)}"))
            try:
                connection.execute(sqlalchemy.text(f"SELECT pg_advisory_lock({PG_OPEN_LOCK})"))
            except sqlalchemy.exc.OperationalError as exc:
                code = getattr(exc.orig, "sqlstate", None) or getattr(exc.orig, "pgcode", None)
                if code == "55P03":  # lock_not_available (psycopg says sqlstate, psycopg2 pgcode)
                    raise _waited_too_long(wait_s) from None
                raise
            try:
                yield
            finally:
                # Closing the connection releases the lock too; unlocking first lets the next
                # process go without waiting for the server to notice the close.
                with contextlib.suppress(sqlalchemy.exc.SQLAlchemyError):
                    unlock = f"SELECT pg_advisory_unlock({PG_OPEN_LOCK})"
                    connection.execute(sqlalchemy.text(unlock))
    finally:
        engine.dispose()


@contextlib.contextmanager
def _file_turn(path: Path, wait_s: float) -> Iterator[None]:
    try:
        handle = path.open("a")
    except OSError:
        # A folder that is missing or that tuner cannot write to: SQLite can neither create
        # nor write a database there, and opening fails in its own words.
        handle = None
    if handle is None:
        yield
        return
    with handle:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise _waited_too_long(wait_s) from None
                time.sleep(0.02)
        yield  # closing the file releases the lock


SQLITE_HEADER = b"SQLite format 3\x00"
"""The first bytes of every SQLite database file."""


def check_database_file(url: str) -> None:
    """An ``InputError`` where a SQLite URL names something that is not a SQLite database (a
    folder, or a file of other bytes), before anything opens it or writes beside it. A file
    that is absent or empty is one SQLite makes a database of."""
    try:
        parsed = sqlalchemy.make_url(url)
    except sqlalchemy.exc.ArgumentError:
        return
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return
    path = Path(str(parsed.database))
    if path.is_dir():
        raise InputError(f"study storage {shown_url(url)}: {path} is a folder, not a database")
    try:
        with path.open("rb") as handle:
            head = handle.read(len(SQLITE_HEADER))
    except FileNotFoundError:
        return
    except OSError as exc:
        raise InputError(
            f"study storage {shown_url(url)}: cannot read {path}: {exc.strerror}"
        ) from None
    if head and head != SQLITE_HEADER:
        raise InputError(f"study storage {shown_url(url)}: {path} is not a SQLite database")


def missing_folder(url: str) -> Path | None:
    """The folder of a SQLite file URL or a journal file, if that folder does not exist."""
    journal = journal_path(url)
    if journal is not None:
        return None if journal.parent.is_dir() else journal.parent
    try:
        parsed = sqlalchemy.make_url(url)
    except sqlalchemy.exc.ArgumentError:
        return None
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    folder = Path(str(parsed.database)).parent
    return None if folder.is_dir() else folder


def open_failure(url: str, exc: BaseException) -> str:
    """``cannot open the study storage URL: CAUSE``, naming a SQLite file's missing folder. The
    cause is SQLAlchemy's or the driver's words, which may name the URL or a piece of its
    password (a host read from it): each is hidden (``tuner.urls.shown_text``)."""
    text = f"cannot open the study storage {shown_url(url)}: {shown_text(cause(exc), [url])}"
    folder = missing_folder(url)
    return text if folder is None else f"{text} (folder {folder} does not exist)"


def abandon(study: optuna.Study, trial: Trial, exc: BaseException) -> TunerError | None:
    """Mark ``trial`` FAIL after ``exc`` escaped it; for a storage error, the error to raise.

    That error says whether the trial could still be marked: a storage that refuses every write
    keeps the trial RUNNING, and the person reading should know.
    """
    storage_failed = isinstance(exc, STORAGE_ERRORS)
    reason = (
        f"the study's storage failed: {cause(exc)}"
        if storage_failed
        else f"interrupted: {type(exc).__name__}"
    )
    with contextlib.suppress(*STORAGE_ERRORS):
        record.give_reason(trial, reason)
    try:
        study.tell(trial, state=TrialState.FAIL)
        marked = "the trial is marked FAIL"
    except STORAGE_ERRORS as again:
        marked = (
            f"marking the trial FAIL failed too ({cause(again)}): it stays RUNNING in the storage"
        )
        if not storage_failed:  # else the error raised says so
            logger.warning("trial %d, %s: %s", trial.number, reason, marked)
    return TunerError(f"trial {trial.number}: {reason}; {marked}") if storage_failed else None
