"""The study's storage as tuner speaks of it: its URL without a password, its failures in a line.

Optuna keeps a study in a database through SQLAlchemy; what goes wrong there (a URL it cannot
parse, a driver not installed, a server not listening, a SQLite file in a folder that does not
exist, a database that stops taking writes) reaches tuner as an exception of SQLAlchemy's or
Optuna's, with a message over several lines. These are failures of the tool's surroundings:
tuner reports them in one line, naming the storage and the cause.
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
from pathlib import Path

import optuna
import sqlalchemy
from optuna.trial import Trial, TrialState

from tuner.errors import TunerError
from tuner.study.attrs import REASON_ATTR

logger = logging.getLogger(__name__)

# What opening or writing to a storage raises when the storage, not tuner, is at fault.
STORAGE_ERRORS: tuple[type[Exception], ...] = (
    sqlalchemy.exc.SQLAlchemyError,
    optuna.exceptions.StorageInternalError,
)
# Opening also imports the database's driver, which may not be installed.
OPEN_ERRORS: tuple[type[Exception], ...] = (*STORAGE_ERRORS, ImportError)

# Seconds a PostgreSQL server may take to accept a connection: one that takes it and never
# answers (a firewall's black hole, a server stuck in recovery) would otherwise hold tuner.
CONNECT_TIMEOUT_S = 10

# The line SQLAlchemy adds to its messages.
_BACKGROUND = re.compile(r"\(Background on this error at: [^)]*\)")


def shown_url(url: str) -> str:
    """The URL as tuner prints it: any password replaced by ``***``."""
    try:
        return sqlalchemy.make_url(url).render_as_string(hide_password=True)
    except sqlalchemy.exc.ArgumentError:
        return url  # not a URL, so no password either


def cause(exc: BaseException) -> str:
    """What went wrong, in one line: the database's own words where it said something.

    Optuna wraps SQLAlchemy's error in a general message of its own, and SQLAlchemy the
    database driver's, adding the statement and a link; the driver's message is the one that
    names the cause (``database is locked``, ``connection refused``).
    """
    if isinstance(exc, optuna.exceptions.StorageInternalError) and exc.__cause__ is not None:
        exc = exc.__cause__
    if isinstance(exc, ImportError) and isinstance(exc.__cause__, ImportError):
        return f"its database driver is not installed ({exc.__cause__})"
    said = getattr(exc, "orig", None) or exc
    return " ".join(_BACKGROUND.sub("", str(said)).split()) or type(said).__name__


def rdb_storage(url: str) -> optuna.storages.RDBStorage:
    """The storage at ``url``; a PostgreSQL server gets ``CONNECT_TIMEOUT_S`` to answer."""
    engine_kwargs = {}
    if sqlalchemy.make_url(url).get_backend_name() == "postgresql":
        engine_kwargs = {"connect_args": {"connect_timeout": CONNECT_TIMEOUT_S}}
    # Two workers opening a new database at once both create Optuna's tables; the slower one
    # finds them made under it (a unique-key error) and, on a second try, uses them.
    for attempt in range(3):
        try:
            return optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs)
        except sqlalchemy.exc.IntegrityError:
            if attempt == 2:
                raise
            time.sleep(0.5 + attempt)
    raise AssertionError("unreachable")


def missing_folder(url: str) -> Path | None:
    """The folder of a SQLite file URL, if that folder does not exist."""
    try:
        parsed = sqlalchemy.make_url(url)
    except sqlalchemy.exc.ArgumentError:
        return None
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    folder = Path(str(parsed.database)).parent
    return None if folder.is_dir() else folder


def open_failure(url: str, exc: BaseException) -> str:
    """``cannot open the study storage URL: CAUSE``, naming a SQLite file's missing folder."""
    text = f"cannot open the study storage {shown_url(url)}: {cause(exc)}"
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
        trial.set_user_attr(REASON_ATTR, reason)
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
