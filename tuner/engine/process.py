"""One vLLM server for one set of engine arguments: ``Engine``, started from a ``--config`` YAML.

The engine writes the server's config and asks its launcher (``tuner.engine.launchers``) to
start it; from then on it talks to the ``ServerHandle`` it got back only: where it answers,
whether it is healthy, its log, its stop. Where and how the server runs is the launcher's.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from tuner.engine import startup
from tuner.engine.handle import LogMark, ServerHandle
from tuner.engine.launchers import Launch, Launcher, ProcessLauncher
from tuner.flags import DATA_PARALLEL, config_yaml, flag_name

logger = logging.getLogger(__name__)


# Environment every server gets unless tuner's own environment sets the variable: a forked
# engine core inherits the API server's imports instead of importing vLLM again, which cut the
# engine start by half on a GPU (benchmarks/results/h100-trial-cost/). vLLM still spawns
# where forking is unsafe (CUDA already initialised, Ray, the CPU build).
SERVER_ENV_DEFAULTS = {"VLLM_WORKER_MULTIPROC_METHOD": "fork"}


# The engine arguments that decide how many API server processes ``vllm serve`` starts: the
# count, and data-parallel-size, which the count defaults to. vLLM's ``api_server`` module reads
# neither, so a server whose arguments name either runs as ``vllm serve``
# (``tuner.engine.serve``): what was measured is what ``vllm serve --config`` of the YAML runs.
API_SERVER_COUNT = "api-server-count"
SERVE_COMMAND_ARGUMENTS = frozenset({API_SERVER_COUNT, DATA_PARALLEL})


def needs_serve_command(args: Mapping[str, Any]) -> bool:
    """Whether these engine arguments (either spelling) name one that only ``vllm serve``
    reads."""
    return any(flag_name(name) in SERVE_COMMAND_ARGUMENTS for name in args)


def server_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` over ``SERVER_ENV_DEFAULTS`` that tuner's own environment does not set."""
    defaults = {k: v for k, v in SERVER_ENV_DEFAULTS.items() if k not in os.environ}
    return {**defaults, **env}


@dataclass
class EngineTimes:
    """Wall-clock seconds of an engine's life."""

    start_s: float = 0.0
    healthy_s: float | None = None
    stop_s: float | None = None
    startup: dict[str, float] = field(default_factory=dict)


@dataclass
class Engine:
    """A vLLM server for one set of engine arguments. Use as a context manager.

    ``start`` launches it and keeps its handle (``handle``); ``wait_healthy``, the log's marks
    and ``stop`` go through that handle, and its log can still be read once stopped.
    """

    # What tuner's lines call the server it starts.
    server_name: ClassVar[str] = "vLLM"

    model: str
    args: Mapping[str, Any]
    workdir: Path
    launcher: Launcher = field(default_factory=ProcessLauncher)
    env: Mapping[str, str] = field(default_factory=dict)
    # The path that answers 200 once the server serves.
    health_path: str = "/health"
    times: EngineTimes = field(default_factory=EngineTimes)
    handle: ServerHandle | None = None
    _stopped: bool = False

    @property
    def base_url(self) -> str:
        assert self.handle is not None, "start() first"
        return self.handle.base_url

    @property
    def config_path(self) -> Path:
        return self.workdir / "engine.yaml"

    @property
    def log_path(self) -> Path:
        """Where a launcher of this machine writes the server's output."""
        return self.workdir / "engine.log"

    def server_argv(self, host: str, port: int) -> list[str]:
        """The server's arguments to listen at ``host`` and ``port``: its config, written."""
        self.config_path.write_text(
            config_yaml({"model": self.model, **self.args, "host": host, "port": port})
        )
        return ["--config", str(self.config_path)]

    def to_launch(self) -> Launch:
        """What the launcher is asked to start."""
        return Launch(
            self.server_argv,
            self.log_path,
            server_env(self.env),
            serve_command=needs_serve_command(self.args),
            name=self.server_name,
            health_path=self.health_path,
        )

    def start(self) -> ServerHandle:
        """Have the launcher start the server; its handle, before it is healthy
        (``EngineFailed`` where the launcher cannot start it)."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.times.start_s = time.monotonic()
        self.handle = self.launcher.launch(self.to_launch())
        logger.info("started %s (%s): %s", self.server_name, self.handle.where, dict(self.args))
        return self.handle

    def wait_healthy(
        self,
        timeout_s: float,
        poll_s: float = 0.25,
        on_poll: Callable[[float], None] | None = None,
    ) -> float:
        """Block until the server answers its health path; return the seconds since start.

        ``EngineFailed`` where it fails or times out (``ServerHandle.wait_healthy``); ``on_poll``
        is told the seconds since start after each unanswered poll.
        """
        handle = self.handle
        assert handle is not None, "start() first"
        seen_at_s: dict[str, float] = {}

        def polled(elapsed_s: float) -> None:
            self._note_markers(seen_at_s)
            if on_poll is not None:
                on_poll(elapsed_s)

        self._note_markers(seen_at_s)
        healthy_s = handle.wait_healthy(timeout_s, self.times.start_s, poll_s, polled)
        self.times.healthy_s = healthy_s
        self._note_markers(seen_at_s)
        self.times.startup = startup.breakdown(seen_at_s, self._log_text(), healthy_s)
        logger.info("%s healthy after %.1f s", self.server_name, healthy_s)
        return healthy_s

    def compile_cache(self) -> dict[str, str | bool]:
        """The compile key and whether vLLM's compile cache held it, as far as its log says."""
        return startup.compile_cache(self._log_text())

    def mark(self) -> LogMark | None:
        """The server's log now: a mark to read what comes after (None before ``start``)."""
        return None if self.handle is None else self.handle.mark()

    def late_compiles(
        self, warmup_at: LogMark | None, window_at: LogMark | None
    ) -> dict[str, float]:
        """Kernels vLLM's JIT monitor saw compiled during tuner's warm-up and its window, the
        log marked at their starts (``mark``): see ``startup.late_compiles_by_phase``."""
        if self.handle is None:
            return {}
        return startup.late_compiles_by_phase(
            self._log_text(),
            self.handle.log_since(warmup_at, until=window_at),
            self.handle.log_since(window_at),
        )

    def log_tail(self) -> str:
        """The server's log's last lines, as an infeasible trial keeps them."""
        return "" if self.handle is None else self.handle.log_tail()

    def _log_text(self) -> str:
        """The server's log, whole."""
        return "" if self.handle is None else self.handle.log_since()

    def _note_markers(self, seen_at_s: dict[str, float]) -> None:
        if len(seen_at_s) == len(startup.MARKERS):
            return
        now = time.monotonic() - self.times.start_s
        for marker in startup.find_markers(self._log_text()):
            seen_at_s.setdefault(marker, now)

    def alive(self) -> bool:
        """Whether the server can still serve: started, and not lost (nor stopped, where
        stopping it is tuner's)."""
        return self.handle is not None and self.handle.alive()

    def stop(self, grace_s: float = 20.0) -> None:
        """Stop the server through its handle (a server of this machine: SIGTERM to its process
        group, then SIGKILL to what is left after ``grace_s``); the seconds it took go to
        ``times.stop_s``."""
        handle = self.handle
        if handle is None or self._stopped:
            return
        self._stopped = True
        began = time.monotonic()
        try:
            handle.stop(grace_s)
        finally:
            self.times.stop_s = time.monotonic() - began

    def __enter__(self) -> Engine:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
