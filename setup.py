"""The build's one addition to pyproject.toml: the commit a wheel is built from, written into
the package as ``tuner/_commit.txt`` (``tuner.build.commit`` reads it), so that an installed
tuner names its build (``tuner --version``, every YAML header)."""

import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from tuner.build import COMMIT_FILE, from_git  # noqa: E402  (the package being built)


class BuildPy(build_py):
    def run(self) -> None:
        super().run()
        commit = from_git(HERE)  # None where not built from a checkout
        written = HERE / "tuner" / COMMIT_FILE  # a source tree that carries its commit
        if commit is None and written.is_file():
            commit = written.read_text().strip()
        if commit:
            (Path(self.build_lib) / "tuner" / COMMIT_FILE).write_text(commit + "\n")


setup(cmdclass={"build_py": BuildPy})
