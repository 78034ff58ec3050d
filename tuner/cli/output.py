"""Where ``tuner run`` writes for people: folders checked before the first trial, files whole.

A configuration file is written to a temporary file beside it and renamed over it, so a reader
(``vllm serve --config``, a second worker writing the same study's file) sees the old file or
the new one, never a part; a disk that fills leaves the old file as it was and no temporary one.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from tuner.errors import InputError, TunerError


def check_writable(folder: Path, option: str) -> None:
    """An ``InputError`` unless ``folder`` is, or can be made, a folder tuner may write in.

    Creates nothing: the closest existing folder on its path is looked at.
    """
    existing = folder.absolute()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise InputError(f"{option} {folder}: {existing} is not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise InputError(f"{option} {folder}: cannot write in {existing} (permission denied)")


def write_whole(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file renamed over it.

    A ``TunerError`` naming the file and the cause if that fails, with nothing left behind.
    """
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
        try:
            with os.fdopen(fd, "w") as handle:
                handle.write(text)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temporary, path)
        except BaseException:
            with contextlib.suppress(OSError):
                temporary.unlink()
            raise
    except OSError as exc:
        raise TunerError(
            f"cannot write {path}: {exc.strerror or exc}; it is left as it was"
        ) from None
