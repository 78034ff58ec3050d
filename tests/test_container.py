"""Where teams run vLLM: the image of examples/container/Dockerfile (tuner on vLLM's OpenAI
server image) and the Kubernetes Job of examples/container/study-job.yaml.

No registry or cluster is reached here, so the files are checked for what would break them: the
image is the vLLM version tuner's GPU results were measured with, every file it copies exists,
its install pins every package the image holds (checked with pip's resolver on this virtualenv,
which holds vLLM's CPU build), and each tuner command the two files run parses with tuner's own
command line.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import REPO

from tuner.cli.parser import build_parser

FOLDER = REPO / "examples" / "container"
DOCKERFILE = FOLDER / "Dockerfile"
JOB = FOLDER / "study-job.yaml"


def instructions() -> list[tuple[str, str]]:
    """The Dockerfile's instructions, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE.read_text())
    lines = [line.strip() for line in text.splitlines()]
    return [
        (word.upper(), rest.strip())
        for word, _, rest in (line.partition(" ") for line in lines if line and line[0] != "#")
    ]


def gpu_vllm_version() -> str:
    pins = re.findall(r'"vllm==([0-9.]+)"', (REPO / "pyproject.toml").read_text())
    assert len(pins) == 1
    return pins[0]


def documented_runs() -> list[list[str]]:
    """The ``docker run ... IMAGE ARGS`` commands in the Dockerfile's comments: tuner's ARGS."""
    text = re.sub(r"\\\n#\s*", " ", DOCKERFILE.read_text())
    runs = re.findall(r"docker run .*? tuner:\S+ (.*)", text)
    assert runs
    return [shlex.split(run) for run in runs]


def test_the_image_is_vllms_server_at_the_measured_version() -> None:
    steps = instructions()
    args = dict(rest.split("=", 1) for word, rest in steps if word == "ARG")
    assert args["VLLM_IMAGE"] == f"vllm/vllm-openai:v{gpu_vllm_version()}"
    assert ("FROM", "${VLLM_IMAGE}") in steps
    assert ("ENTRYPOINT", '["tuner"]') in steps
    tag = f"tuner:vllm-{gpu_vllm_version()}"
    assert f"-t {tag} ." in DOCKERFILE.read_text()
    assert (
        yaml.safe_load(JOB.read_text())["spec"]["template"]["spec"]["containers"][0]["image"] == tag
    )


def test_every_file_the_image_copies_is_in_the_repository() -> None:
    copies = [rest.split() for word, rest in instructions() if word == "COPY"]
    assert copies
    for *sources, _ in copies:
        for source in sources:
            assert (REPO / source).exists(), source


def test_the_install_pins_what_the_image_holds() -> None:
    (run,) = [rest for word, rest in instructions() if word == "RUN"]
    assert "pip list --format=freeze --exclude-editable > /tmp/image-packages.txt" in run
    assert "pip install --no-cache-dir --constraint /tmp/image-packages.txt /opt/tuner" in run


@pytest.mark.parametrize("tuner_args", documented_runs(), ids=lambda a: a[0])
def test_the_commands_the_image_documents_parse(tuner_args: list[str]) -> None:
    build_parser().parse_args(tuner_args)


def test_the_job_runs_one_study_on_one_gpu_and_never_retries_by_itself() -> None:
    job = yaml.safe_load(JOB.read_text())
    assert job["apiVersion"] == "batch/v1" and job["kind"] == "Job"
    assert job["spec"]["backoffLimit"] == 0
    pod = job["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    (container,) = pod["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    parsed = build_parser().parse_args(container["args"])
    assert parsed.command == "run" and parsed.time_budget_s
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"] for v in pod["volumes"]}
    assert mounts == {"work": container["workingDir"], "shm": "/dev/shm"} and volumes == set(mounts)


@pytest.mark.packaging  # pip resolves the install against the environment: seconds
def test_pip_keeps_every_installed_package_as_the_image_install_asks(tmp_path: Path) -> None:
    # The image's step on this virtualenv (vLLM's CPU build, tuner's needs): pinned to what is
    # installed, pip finds nothing to change but tuner itself.
    listed = subprocess.run(
        [sys.executable, "-m", "pip", "list", "--format=freeze", "--exclude-editable"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    pins = tmp_path / "image-packages.txt"
    pins.write_text(listed.stdout)
    assert re.search(r"^vllm(-cpu)?==", listed.stdout, flags=re.MULTILINE)
    dry = subprocess.run(
        [
            sys.executable, "-m", "pip", "install", "--dry-run", "--no-index",
            "--no-build-isolation", "--constraint", str(pins), str(REPO),
        ],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert dry.returncode == 0, dry.stdout + dry.stderr
    would = re.findall(r"^Would install (.*)$", dry.stdout, flags=re.MULTILINE)
    assert [name.rsplit("-", 1)[0] for name in " ".join(would).split()] == ["vllm-serve-tuner"], (
        dry.stdout
    )
