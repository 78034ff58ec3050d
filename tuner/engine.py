"""One vLLM OpenAI server process, started from a ``--config`` YAML: the only subprocess code.

The server runs as its own process group on 127.0.0.1 and a free port. Stopping it sends
SIGTERM to the group, then SIGKILL to whatever is left, so no engine process outlives a trial.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tuner.flags import config_yaml

logger = logging.getLogger(__name__)

DEFAULT_COMMAND = (sys.executable, "-m", "vllm.entrypoints.openai.api_server")


class EngineFailed(Exception):
    """The server exited or did not become healthy; ``log_tail`` says why."""

    def __init__(self, reason: str, log_tail: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.log_tail = log_tail


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def tail(path: Path, lines: int = 40) -> str:
    try:
        with path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - 64 * 1024))
            text = handle.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


@dataclass
class EngineTimes:
    """Wall-clock seconds of an engine's life."""

    start_s: float = 0.0
    healthy_s: float | None = None
    stop_s: float | None = None


@dataclass
class Engine:
    """A vLLM server for one set of engine arguments. Use as a context manager."""

    model: str
    args: Mapping[str, Any]
    workdir: Path
    command: Sequence[str] = DEFAULT_COMMAND
    env: Mapping[str, str] = field(default_factory=dict)
    host: str = "127.0.0.1"
    port: int = 0
    times: EngineTimes = field(default_factory=EngineTimes)
    _process: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def config_path(self) -> Path:
        return self.workdir / "engine.yaml"

    @property
    def log_path(self) -> Path:
        return self.workdir / "engine.log"

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = self.port or free_port()
        self.config_path.write_text(
            config_yaml({"model": self.model, **self.args, "host": self.host, "port": self.port})
        )
        log = self.log_path.open("wb")
        logger.info("starting vLLM on port %d: %s", self.port, dict(self.args))
        self.times.start_s = time.monotonic()
        self._process = subprocess.Popen(
            [*self.command, "--config", str(self.config_path)],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **self.env},
            start_new_session=True,
        )
        log.close()

    def wait_healthy(self, timeout_s: float, poll_s: float = 0.5) -> float:
        """Block until ``/health`` answers 200; return the seconds since start."""
        assert self._process is not None, "start() first"
        deadline = self.times.start_s + timeout_s
        with httpx.Client(base_url=self.base_url, timeout=5.0) as client:
            while True:
                code = self._process.poll()
                if code is not None:
                    raise EngineFailed(
                        f"vLLM exited with status {code} before it was healthy",
                        tail(self.log_path),
                    )
                try:
                    if client.get("/health").status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise EngineFailed(
                        f"vLLM was not healthy within {timeout_s:g} s", tail(self.log_path)
                    )
                time.sleep(poll_s)
        self.times.healthy_s = time.monotonic() - self.times.start_s
        logger.info("vLLM healthy after %.1f s", self.times.healthy_s)
        return self.times.healthy_s

    def alive(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def stop(self, grace_s: float = 20.0) -> None:
        """SIGTERM to the process group, then SIGKILL to what is left of it after ``grace_s``."""
        process = self._process
        if process is None:
            return
        began = time.monotonic()
        pgid = process.pid
        _signal_group(pgid, signal.SIGTERM)
        try:
            process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            logger.warning("vLLM did not stop within %.0f s; killing it", grace_s)
        # Engine-core workers can outlive the API server; the group kill takes them too.
        _signal_group(pgid, signal.SIGKILL)
        process.wait()
        self._process = None
        self.times.stop_s = time.monotonic() - began

    def __enter__(self) -> Engine:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)
