"""One vLLM OpenAI server process, started from a ``--config`` YAML.

The server runs as its own process group on 127.0.0.1 and a free port. Stopping it sends
SIGTERM to the group, then SIGKILL to whatever is left, so no engine process outlives a trial.
With ``tuner.engine.launchers``, the only subprocess code.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import httpx

from tuner.engine import startup
from tuner.engine.launchers import (
    EngineFailed,
    Launcher,
    ProcessLauncher,
    ServerProcess,
    first_error,
    signal_group,
    tail,
)
from tuner.flags import config_yaml, flag_name

logger = logging.getLogger(__name__)


# Environment every server gets unless tuner's own environment sets the variable.
# VLLM_WORKER_MULTIPROC_METHOD=fork: vLLM's command line otherwise spawns the engine-core
# process, a fresh interpreter that imports vLLM again; forked, it inherits the API server's
# imports. On the H100 (vLLM 0.26.0, 3B shape, zygote launcher, 3 repeats) that cut the
# engine-core start from 24.4 s to 2.3 s and engine start from 40.8 s to 18.3 s, with the same
# TTFT, TPOT and throughput (benchmarks/results/h100-trial-cost/). vLLM still spawns where
# forking is unsafe (CUDA already initialised, Ray, the CPU build), whatever this says.
SERVER_ENV_DEFAULTS = {"VLLM_WORKER_MULTIPROC_METHOD": "fork"}


# The engine arguments that decide how many API server processes ``vllm serve`` starts: the
# count, and data-parallel-size, which the count defaults to (vLLM 0.26.0 to 0.32.0). vLLM's
# ``api_server`` module reads neither (it serves from one process whatever they say), so a
# server whose arguments name either is started as ``vllm serve`` (``tuner.engine.serve``),
# one API server or several: what was measured is then what ``vllm serve --config`` of the
# emitted YAML runs.
API_SERVER_COUNT = "api-server-count"
SERVE_COMMAND_ARGUMENTS = frozenset({API_SERVER_COUNT, "data-parallel-size"})


def needs_serve_command(args: Mapping[str, Any]) -> bool:
    """Whether these engine arguments (either spelling) name one that only ``vllm serve``
    reads."""
    return any(flag_name(name) in SERVE_COMMAND_ARGUMENTS for name in args)


def server_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` over ``SERVER_ENV_DEFAULTS`` that tuner's own environment does not set."""
    defaults = {k: v for k, v in SERVER_ENV_DEFAULTS.items() if k not in os.environ}
    return {**defaults, **env}


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the server binds it next)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class EngineTimes:
    """Wall-clock seconds of an engine's life."""

    start_s: float = 0.0
    healthy_s: float | None = None
    stop_s: float | None = None
    startup: dict[str, float] = field(default_factory=dict)


@dataclass
class Engine:
    """A vLLM server for one set of engine arguments. Use as a context manager."""

    # What tuner's lines call the server it starts.
    server_name: ClassVar[str] = "vLLM"

    model: str
    args: Mapping[str, Any]
    workdir: Path
    launcher: Launcher = field(default_factory=ProcessLauncher)
    env: Mapping[str, str] = field(default_factory=dict)
    host: str = "127.0.0.1"
    port: int = 0
    # The path that answers 200 once the server serves.
    health_path: str = "/health"
    times: EngineTimes = field(default_factory=EngineTimes)
    _server: ServerProcess | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        """The server's process id, which is also its process group's; None unless started."""
        return None if self._server is None else self._server.pid

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
        logger.info("starting vLLM on port %d: %s", self.port, dict(self.args))
        self.times.start_s = time.monotonic()
        self._server = self.launcher.launch(
            ["--config", str(self.config_path)],
            self.log_path,
            server_env(self.env),
            serve_command=needs_serve_command(self.args),
        )

    def wait_healthy(
        self,
        timeout_s: float,
        poll_s: float = 0.25,
        on_poll: Callable[[float], None] | None = None,
    ) -> float:
        """Block until ``health_path`` answers 200; return the seconds since start.

        ``on_poll`` is told the seconds since start after each unanswered poll.
        """
        assert self._server is not None, "start() first"
        deadline = self.times.start_s + timeout_s
        seen_at_s: dict[str, float] = {}
        with httpx.Client(base_url=self.base_url, timeout=5.0) as client:
            while True:
                self._note_markers(seen_at_s)
                code = self._server.poll()
                if code is not None:
                    cause = first_error(self.log_path)
                    raise EngineFailed(
                        f"{self.server_name} exited with status {code} before it was healthy"
                        + (f" ({cause})" if cause else ""),
                        tail(self.log_path),
                    )
                lost = self._server.lost()
                if lost is not None:
                    raise lost
                try:
                    if client.get(self.health_path).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise EngineFailed(
                        f"{self.server_name} was not healthy within {timeout_s:g} s",
                        tail(self.log_path),
                    )
                if on_poll is not None:
                    on_poll(time.monotonic() - self.times.start_s)
                time.sleep(poll_s)
        self.times.healthy_s = time.monotonic() - self.times.start_s
        self._note_markers(seen_at_s)
        self.times.startup = startup.breakdown(seen_at_s, self._log_text(), self.times.healthy_s)
        logger.info("%s healthy after %.1f s", self.server_name, self.times.healthy_s)
        return self.times.healthy_s

    def compile_cache(self) -> dict[str, str | bool]:
        """The compile key and whether vLLM's compile cache held it, as far as its log says."""
        return startup.compile_cache(self._log_text())

    def log_size(self) -> int:
        """The engine log's length in bytes now: a mark to read what comes after."""
        try:
            return self.log_path.stat().st_size
        except OSError:
            return 0

    def late_compiles(self, warmup_at: int, window_at: int) -> dict[str, float]:
        """Kernels vLLM's JIT monitor saw compiled during tuner's warm-up and its window, the
        log marked at their starts (``log_size``): see ``startup.late_compiles_by_phase``."""
        try:
            log = self.log_path.read_bytes()
        except OSError:
            return {}
        return startup.late_compiles_by_phase(log, warmup_at, window_at)

    def _log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def _note_markers(self, seen_at_s: dict[str, float]) -> None:
        if len(seen_at_s) == len(startup.MARKERS):
            return
        now = time.monotonic() - self.times.start_s
        for marker in startup.find_markers(self._log_text()):
            seen_at_s.setdefault(marker, now)

    def alive(self) -> bool:
        server = self._server
        return server is not None and server.running() and server.lost() is None

    def stop(self, grace_s: float = 20.0) -> None:
        """SIGTERM to the process group, then SIGKILL to what is left of it after ``grace_s``."""
        server, self._server = self._server, None
        if server is None:
            return
        began = time.monotonic()
        with _signals_deferred():
            signal_group(server.pid, signal.SIGTERM)
            if not server.wait(grace_s):
                logger.warning(
                    "%s did not stop within %.0f s; killing it", self.server_name, grace_s
                )
            # Engine-core workers can outlive the API server; the group kill takes them too,
            # and every API server process of ``vllm serve``.
            signal_group(server.pid, signal.SIGKILL)
            server.wait(30.0)
            self.times.stop_s = time.monotonic() - began

    def __enter__(self) -> Engine:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def _signals_deferred() -> Iterator[None]:
    """Hold Ctrl-C and SIGTERM until the block ends, then act on the first one that came.

    A stop is what an interrupt asks for: a second Ctrl-C in the middle of it must not leave
    the server running. Only the main thread can set handlers; elsewhere this does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []
    held = (signal.SIGINT, signal.SIGTERM)
    previous = {
        sig: signal.signal(sig, lambda signum, frame: pending.append(signum)) for sig in held
    }
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if pending:
            signal.raise_signal(pending[0])
