"""Security: servers on 127.0.0.1 only, no shell, no secret from the environment written down.

``tuner run`` here starts the stand-in server (``tuner.testing.standin``) with each launcher, in
seconds; ``test_run_e2e.py`` asserts the same of a run on real vLLM
(``test_servers_listen_on_127_0_0_1_only``, ``test_no_secret_in_any_file_written``).
"""

from __future__ import annotations

import ast
import os
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from conftest import (
    MARKER,
    REPO,
    cpu_spec,
    listening_sockets,
    marked_processes,
    tuner_command,
    wait_for_no_processes,
    write_small_trace,
    write_spec,
)

from tuner.cli.exits import MEETS_SLOS_EXITS


def shell_calls(path: Path) -> list[str]:
    """``FILE:LINE`` of each call in ``path`` that passes ``shell=`` anything but False."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.Call):
            continue
        for keyword in node.keywords:
            value = keyword.value
            if keyword.arg == "shell" and not (
                isinstance(value, ast.Constant) and value.value is False
            ):
                found.append(f"{path.relative_to(REPO)}:{node.lineno}")
    return found


def test_no_shell_true_anywhere() -> None:
    """No subprocess goes through a shell, in tuner, its benchmarks or its tests."""
    folders = [REPO / "tuner", REPO / "benchmarks", REPO / "tests"]
    files = [path for folder in folders for path in folder.rglob("*.py")]
    assert len(files) > 50
    assert [call for path in files for call in shell_calls(path)] == []


@pytest.mark.vllm
@pytest.mark.parametrize("launcher", ["process", "zygote"])
def test_stand_in_run_listens_on_loopback_and_writes_no_secret(
    tmp_path: Path, cpu_model: Path, stand_in_vllm: dict[str, str], launcher: str
) -> None:
    """Two trials with ``HF_TOKEN`` and ``VLLM_API_KEY`` set and tuner's log on: every socket the
    run's processes listen on is on 127.0.0.1, and neither secret is in any file written."""
    secrets = {"HF_TOKEN": "hf_" + uuid.uuid4().hex, "VLLM_API_KEY": uuid.uuid4().hex}
    write_spec(tmp_path / "spec.yaml", cpu_spec(cpu_model, window_s=2, time_scale=1, n_trials=2))
    trace = write_small_trace(tmp_path / "trace.csv")
    marker = uuid.uuid4().hex
    env = {**os.environ, **stand_in_vllm, **secrets, MARKER: marker}
    command = tuner_command(
        "-v", "run", "--trace", trace, "--study", "s", "--spec", tmp_path / "spec.yaml",
        "--storage", f"sqlite:///{tmp_path / 's.db'}", "--launcher", launcher,
    )  # fmt: skip
    listening: set[tuple[str, int]] = set()
    with (tmp_path / "tuner.log").open("wb") as log:
        proc = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=log, stderr=log)
        deadline = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline:
            pids = [int(line.split()[0]) for line in marked_processes(marker)]
            listening |= listening_sockets(pids)
            time.sleep(0.1)
        if proc.poll() is None:
            proc.kill()
    text = (tmp_path / "tuner.log").read_text()
    assert proc.wait() in MEETS_SLOS_EXITS, text
    assert wait_for_no_processes(marker) == []
    assert listening and {address for address, _ in listening} == {"127.0.0.1"}, listening
    written = [path for path in tmp_path.rglob("*") if path.is_file()]
    names = {path.name for path in written}
    assert {"s.db", "s.yaml", "engine.log", "engine.yaml"} <= names, names
    engine_log = tmp_path / "runs" / "s" / "trial-0001" / "engine.log"
    assert "stand-in vLLM: startup complete" in engine_log.read_text()
    assert "INFO" in text
    for secret in secrets.values():
        assert [p for p in written if secret.encode() in p.read_bytes()] == []
