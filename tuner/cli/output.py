"""Where ``tuner run`` writes for people, checked before the first trial: the folders it will
write in. Files are written whole (``tuner.study.result.written.write_whole``)."""

from __future__ import annotations

import os
from pathlib import Path

from tuner.errors import InputError


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
