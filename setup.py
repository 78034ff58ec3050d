"""The build's one addition to pyproject.toml: the commit a wheel is built from, written into
the package as ``tuner/_commit.txt`` (``tuner.build.commit`` reads it), so that an installed
tuner names its build (``tuner --version``, every YAML header)."""

import subprocess
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py


def _commit() -> str:
    here = Path(__file__).resolve().parent
    try:
        head = subprocess.run(
            ["git", "-C", str(here), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        status = ["status", "--porcelain", "--untracked-files=no", "--", "tuner"]
        changed = subprocess.run(
            ["git", "-C", str(here), *status],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""  # not built from a checkout (an sdist): the version alone
    return f"{head}+changes" if changed else head


class BuildPy(build_py):
    def run(self) -> None:
        super().run()
        commit = _commit()
        if commit:
            (Path(self.build_lib) / "tuner" / "_commit.txt").write_text(commit + "\n")


setup(cmdclass={"build_py": BuildPy})
