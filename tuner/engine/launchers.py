"""How a vLLM server process comes to be: a fresh interpreter, or a fork of a warm zygote.

A ``Launcher`` starts a server process as its own process group and hands back a
``ServerProcess``; ``tuner.engine.process`` decides when, with what arguments, and stops it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

logger = logging.getLogger(__name__)

SERVER_MODULE = "vllm.entrypoints.openai.api_server"


class EngineFailed(Exception):
    """The server exited or did not become healthy; ``log_tail`` says why."""

    def __init__(self, reason: str, log_tail: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.log_tail = log_tail


def tail(path: Path, lines: int = 40) -> str:
    try:
        with path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - 64 * 1024))
            text = handle.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


class ServerProcess:
    """A started server: its pid (also its process group) and a way to read its exit code."""

    def __init__(self, pid: int, popen: subprocess.Popen[bytes] | None, status: Path | None):
        self.pid = pid
        self._popen = popen
        self._status = status

    def poll(self) -> int | None:
        if self._popen is not None:
            return self._popen.poll()
        assert self._status is not None
        try:
            return int(self._status.read_text())
        except (FileNotFoundError, ValueError):
            return None

    def wait(self, timeout_s: float) -> int | None:
        deadline = time.monotonic() + timeout_s
        while (code := self.poll()) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        return code


class Launcher(Protocol):
    """Starts vLLM server processes, each its own process group."""

    def launch(self, argv: Sequence[str], log: Path, env: Mapping[str, str]) -> ServerProcess: ...

    def close(self) -> None: ...


@dataclass
class ProcessLauncher:
    """A fresh interpreter per server: ``python -m vllm.entrypoints.openai.api_server``."""

    module: str = SERVER_MODULE
    python: str = sys.executable

    def launch(self, argv: Sequence[str], log: Path, env: Mapping[str, str]) -> ServerProcess:
        with log.open("ab") as out:
            popen = subprocess.Popen(
                [self.python, "-m", self.module, *argv],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **env},
                start_new_session=True,
            )
        return ServerProcess(popen.pid, popen, None)

    def close(self) -> None:
        pass


@dataclass
class ZygoteLauncher:
    """One long-lived process that imports vLLM once and forks a server per trial.

    See ``tuner.engine.zygote``. Saves the server process's interpreter start and imports on every
    trial; what runs after the fork is the same module ``ProcessLauncher`` runs.
    """

    module: str = SERVER_MODULE
    python: str = sys.executable
    log: Path | None = None
    import_s: float | None = None
    _process: subprocess.Popen[bytes] | None = None

    def _ensure_started(self) -> subprocess.Popen[bytes]:
        if self._process is not None and self._process.poll() is None:
            return self._process
        began = time.monotonic()
        if self.log is not None:
            self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") if self.log else open(os.devnull, "wb") as err:
            self._process = subprocess.Popen(
                [self.python, "-m", "tuner.engine.zygote", self.module],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                start_new_session=True,
            )
        reply = self._read_reply(self._process)
        self.import_s = time.monotonic() - began
        logger.info("launcher ready after %.1f s (threads: %s)", self.import_s, reply["threads"])
        return self._process

    def _read_reply(self, process: subprocess.Popen[bytes]) -> dict[str, Any]:
        assert process.stdout is not None
        line = process.stdout.readline()
        if not line:
            raise EngineFailed("the tuner launcher exited", "")
        return dict(json.loads(line))

    def launch(self, argv: Sequence[str], log: Path, env: Mapping[str, str]) -> ServerProcess:
        process = self._ensure_started()
        status = log.with_name(log.name + ".exit")
        status.unlink(missing_ok=True)
        request = {"argv": list(argv), "log": str(log), "env": dict(env), "status": str(status)}
        assert process.stdin is not None
        process.stdin.write(json.dumps(request).encode() + b"\n")
        process.stdin.flush()
        return ServerProcess(int(self._read_reply(process)["pid"]), None, status)

    def close(self) -> None:
        """Close the launcher's stdin: it stops any server left and exits."""
        process, self._process = self._process, None
        if process is None:
            return
        assert process.stdin is not None
        process.stdin.close()
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            signal_group(process.pid, signal.SIGKILL)
            process.wait()


def signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)
