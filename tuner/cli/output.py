"""Where tuner writes for people, checked before the work: the folders ``tuner run`` will write
in, and a file such as ``--png`` whose folder must exist. Files are written whole
(``tuner.study.result.written.write_whole``)."""

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


def check_file_target(path: Path, option: str) -> None:
    """An ``InputError`` unless ``path`` can be written as a file: its folder exists and may be
    written in, and it is not a folder itself."""
    folder = path.absolute().parent
    if not folder.is_dir():
        raise InputError(f"{option} {path}: folder {folder} does not exist")
    if path.is_dir():
        raise InputError(f"{option} {path}: is a folder")
    if not os.access(folder, os.W_OK | os.X_OK) and not os.access(path, os.W_OK):
        raise InputError(f"{option} {path}: cannot write in {folder} (permission denied)")
