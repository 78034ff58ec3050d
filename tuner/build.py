"""Which build of tuner this is: its version and, where known, the commit it was built from.

A wheel or a snapshot carries the commit in ``_commit.txt`` beside this module, written when it
was built (``setup.py``'s ``build_py``; ``benchmarks/gpu/stage.sh`` for the device's snapshot);
a checkout asks git, and says where its files differ from that commit. ``describe()`` is what
``tuner --version`` and every YAML header print: ``0.1.0 (commit 1a2b3c4)``.
"""

from __future__ import annotations

import subprocess
from functools import cache
from pathlib import Path

import tuner

COMMIT_FILE = "_commit.txt"
HERE = Path(__file__).resolve().parent
# A checkout: the package beside the project's own pyproject.toml and git folder, not a package
# installed into some other repository's virtualenv.
CHECKOUT = HERE.parent


def commit() -> str | None:
    """The commit this build is of (``1a2b3c4``, ``1a2b3c4+changes`` for a checkout whose
    package files differ from it); None where neither the build nor git says."""
    written = HERE / COMMIT_FILE
    if written.is_file():
        return written.read_text().strip() or None
    if not ((CHECKOUT / "pyproject.toml").is_file() and (CHECKOUT / ".git").exists()):
        return None
    return from_git(CHECKOUT)


def from_git(checkout: Path) -> str | None:
    """The commit git has ``checkout`` at (``1a2b3c4+changes`` where the files of its ``tuner``
    package differ from it); None where git does not say. ``setup.py`` writes it into a wheel."""
    head = _git(checkout, "rev-parse", "--short", "HEAD")
    if head is None:
        return None
    changed = _git(checkout, "status", "--porcelain", "--untracked-files=no", "--", "tuner")
    return f"{head}+changes" if changed else head


@cache
def describe() -> str:
    """The version, with the commit where known: ``0.1.0 (commit 1a2b3c4)``; asked once a
    process."""
    built = commit()
    return tuner.__version__ if built is None else f"{tuner.__version__} (commit {built})"


def _git(checkout: Path, *args: str) -> str | None:
    """What ``git args`` prints in ``checkout``, stripped; None where git fails or is absent."""
    try:
        done = subprocess.run(
            ["git", "-C", str(checkout), *args], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None
