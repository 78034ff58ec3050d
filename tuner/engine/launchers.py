"""How a server comes to be: a fresh interpreter, or a fork of a warm zygote.

A ``Launcher`` starts the server a ``Launch`` asks for and hands back its
``tuner.engine.handle.ServerHandle``; ``tuner.engine.process`` decides when and with what
arguments, and talks to the handle only. The launchers here start a ``LocalServer``
(``tuner.engine.local``): on 127.0.0.1 and a free port, its own process group, dying with tuner.
The process runs one of two modules: vLLM's ``api_server`` (``SERVER_MODULE``), one API server
in that process, or ``vllm serve`` (``SERVE_MODULE``), which starts as many API server
processes as ``api-server-count`` says; the spec says which (``serve_command``).

A server's process group stays in tuner's session: Linux's scheduler (autogroup) shares the CPU
between sessions first, and a server in a session of its own held tuner's client late for
seconds (benchmarks/results/cpu-client-lag/).
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Protocol

from tuner.engine.handle import EngineFailed, ServerHandle
from tuner.engine.local import LOCAL_HOST, LocalServer, ended, free_port, signal_group, tail
from tuner.engine.zygote import Channel, die_with

logger = logging.getLogger(__name__)

# vLLM's OpenAI server: one API server, in the process that runs it.
SERVER_MODULE = "vllm.entrypoints.openai.api_server"
# ``vllm serve`` (tuner.engine.serve): with api-server-count above 1, the engine core and that
# many API server processes, all in the process group of the one that runs it.
SERVE_MODULE = "tuner.engine.serve"


@dataclass(frozen=True)
class Launch:
    """A launch: what a launcher is asked to start.

    ``argv(host, port)``: the server's arguments once told the address it is to listen at (it
    writes any file they name); for ``ProcessLauncher`` and ``ZygoteLauncher`` the arguments of
    the server's module, for a ``CommandLauncher`` the whole command. Its output goes to ``log``,
    ``env`` over tuner's environment; ``serve_command``: run as ``vllm serve``; ``name``: what
    tuner's lines call it; ``health_path``: what answers 200 once it serves.
    """

    argv: Callable[[str, int], Sequence[str]]
    log: Path
    env: Mapping[str, str] = field(default_factory=dict)
    serve_command: bool = False
    name: str = "vLLM"
    health_path: str = "/health"


class Launcher(Protocol):
    """Starts servers, and hands back each one's handle.

    ``launch`` starts what ``server`` asks for and returns as soon as it has started, before it
    is healthy (``ServerHandle.wait_healthy``); ``EngineFailed`` where it cannot start it (the
    trial's failure, not the study's). ``close`` ends what the launcher holds; servers it
    started and that are not stopped yet stop with it, or with tuner.
    """

    def launch(self, server: Launch) -> ServerHandle: ...

    def close(self) -> None: ...


def spawn(argv: Sequence[str], out: IO[bytes], env: Mapping[str, str]) -> subprocess.Popen[bytes]:
    """Start ``argv`` as a server writing to ``out`` (its log): its own process group (stopped
    as one; Ctrl-C at the terminal reaches tuner only), in tuner's session (the module's
    docstring says why), dying with tuner. ``OSError`` where it cannot be run."""
    return subprocess.Popen(
        list(argv),
        stdout=out,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env={**os.environ, **env},
        process_group=0,
        preexec_fn=die_with(os.getpid()),
    )


@dataclass
class ProcessLauncher:
    """A fresh interpreter per server: ``python -m vllm.entrypoints.openai.api_server``, or
    ``python -m tuner.engine.serve`` (``vllm serve``)."""

    module: str = SERVER_MODULE
    python: str = sys.executable
    serve_module: str = SERVE_MODULE

    def command(self, server: Launch, port: int) -> list[str]:
        """The words that start ``server`` listening at ``port``."""
        module = self.serve_module if server.serve_command else self.module
        return [self.python, "-m", module, *server.argv(LOCAL_HOST, port)]

    def launch(self, server: Launch) -> LocalServer:
        launched_at = time.monotonic()
        port = free_port()
        argv = self.command(server, port)
        with server.log.open("ab") as out:
            popen = spawn(argv, out, server.env)
        return LocalServer(
            popen.pid, popen, port, server.log, server.name, server.health_path, launched_at
        )

    def close(self) -> None:
        pass


# How long a new zygote may take to import the server module and say it is ready: well above
# vLLM's import (benchmarks/results/h100-trial-cost/), well under a health timeout.
READY_TIMEOUT_S = 300.0
# How long a ready zygote may take to answer a launch (it forks and replies in milliseconds).
REPLY_TIMEOUT_S = 30.0


class ForkedServer(LocalServer):
    """A server the zygote forked. Not tuner's child: its exit status is a file the zygote writes
    when it reaps it, whether it runs is read from a pidfd, and a dead zygote loses it (the
    tails of ``logs``, the server's and the zygote's, say why)."""

    def __init__(
        self,
        pid: int,
        port: int,
        server: Launch,
        launched_at: float,
        status: Path,
        zygote: subprocess.Popen[bytes],
        logs: list[Path],
    ) -> None:
        super().__init__(pid, None, port, server.log, server.name, server.health_path, launched_at)
        self._status = status
        self._zygote = zygote
        self._logs = logs
        self._pidfd: int | None = None
        self._gone = False
        try:
            self._pidfd = os.pidfd_open(pid)
        except ProcessLookupError:
            self._gone = True  # exited already; the zygote writes its status
        except OSError:
            pass  # no pidfd_open (Linux before 5.3): ``running`` falls back on kill(pid, 0)

    def poll(self) -> int | None:
        try:
            return int(self._status.read_text())
        except (FileNotFoundError, ValueError):
            return None

    def running(self) -> bool:
        if self._gone or self.poll() is not None:
            return False
        if self._pidfd is not None:
            # A pidfd reads as ready once its process has ended, reaped or not, and never
            # stands for a later process that happens to get the same pid.
            self._gone = bool(select.select([self._pidfd], [], [], 0)[0])
        else:
            try:
                os.kill(self.pid, 0)
            except ProcessLookupError:
                self._gone = True
        if self._gone and self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None
        return not self._gone

    def launcher_lost(self) -> EngineFailed | None:
        code = self._zygote.poll()
        if code is None:
            return None
        tails = [f"--- {log.name}\n{tail(log, 20)}" for log in self._logs]
        return EngineFailed(f"the tuner launcher (zygote) died ({ended(code)})", "\n".join(tails))

    def __del__(self) -> None:
        if self._pidfd is not None:
            os.close(self._pidfd)


@dataclass
class ZygoteLauncher:
    """One long-lived process that imports vLLM once and forks a server per trial.

    See ``tuner.engine.zygote``. Saves the server process's interpreter start and imports on every
    trial; what runs after the fork is the same module ``ProcessLauncher`` runs. The zygote
    imports ``module`` when it starts and ``serve_module`` the first time a launch asks for it,
    so that launch may take up to ``ready_timeout_s``. Requests and replies go over a private
    socket; the zygote's own output goes to ``log``. A zygote that dies or stops answering fails
    the trial at hand (``EngineFailed``); the next launch starts afresh.
    """

    module: str = SERVER_MODULE
    python: str = sys.executable
    log: Path | None = None
    ready_timeout_s: float = READY_TIMEOUT_S
    reply_timeout_s: float = REPLY_TIMEOUT_S
    import_s: float | None = None
    serve_module: str = SERVE_MODULE
    _process: subprocess.Popen[bytes] | None = None
    _channel: Channel | None = None
    # The modules the running zygote has imported.
    _imported: set[str] = field(default_factory=set)

    def _ensure_started(self) -> tuple[subprocess.Popen[bytes], Channel]:
        if self._process is not None and self._channel is not None:
            if self._process.poll() is None:
                return self._process, self._channel
            logger.warning(
                "the launcher (zygote) has ended (%s); starting another",
                ended(self._process.returncode),
            )
            self._discard()
        began = time.monotonic()
        if self.log is not None:
            self.log.parent.mkdir(parents=True, exist_ok=True)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        with theirs, self.log.open("ab") if self.log else open(os.devnull, "wb") as out:
            self._process = subprocess.Popen(
                [self.python, "-m", "tuner.engine.zygote", self.module, str(theirs.fileno())],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                pass_fds=(theirs.fileno(),),
                process_group=0,  # its servers in tuner's session, as ProcessLauncher's
            )
        self._channel = Channel(ours)
        self._imported = set()
        reply = self._exchange(None, self.ready_timeout_s, "it was ready")
        self._imported.add(self.module)
        self.import_s = time.monotonic() - began
        logger.info("launcher ready after %.1f s (threads: %s)", self.import_s, reply["threads"])
        return self._process, self._channel

    def _exchange(
        self, request: dict[str, Any] | None, timeout_s: float, what: str
    ) -> dict[str, Any]:
        """Send ``request`` (if any) and read the reply, or fail with the launcher log's tail."""
        assert self._process is not None and self._channel is not None
        process, channel = self._process, self._channel
        try:
            if request is not None:
                channel.send(request)
            reply = channel.receive(timeout_s)
        except TimeoutError:
            self._discard()
            raise EngineFailed(
                f"the tuner launcher (zygote) did not answer within {timeout_s:g} s", self._tail()
            ) from None
        except OSError:
            reply = None  # it closed its end: it is gone
        if reply is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=5)
            code = process.poll()
            self._discard()
            how = "closed its channel" if code is None else ended(code)
            raise EngineFailed(f"the tuner launcher (zygote) {how} before {what}", self._tail())
        if "error" in reply:
            raise EngineFailed(f"the tuner launcher (zygote): {reply['error']}", self._tail())
        return reply

    def _tail(self) -> str:
        return tail(self.log) if self.log is not None else ""

    def launch(self, server: Launch) -> ForkedServer:
        launched_at = time.monotonic()
        process, _ = self._ensure_started()
        module = self.serve_module if server.serve_command else self.module
        log = server.log
        status = log.with_name(log.name + ".exit")
        status.unlink(missing_ok=True)
        port = free_port()
        request = {
            "module": module,
            "argv": list(server.argv(LOCAL_HOST, port)),
            "log": str(log),
            "env": dict(server.env),
            "status": str(status),
        }
        # A module the zygote has not imported yet, it imports before it forks.
        timeout_s = self.reply_timeout_s if module in self._imported else self.ready_timeout_s
        reply = self._exchange(request, timeout_s, "it forked the server")
        self._imported.add(module)
        logs = [log] if self.log is None else [log, self.log]
        pid = int(reply["pid"])
        return ForkedServer(pid, port, server, launched_at, status, process, logs)

    def _discard(self) -> None:
        """Kill a zygote that cannot be trusted; the kernel sends its children SIGTERM."""
        process, self._process = self._process, None
        channel, self._channel = self._channel, None
        if channel is not None:
            channel.close()
        if process is not None:
            signal_group(process.pid, signal.SIGKILL)
            process.wait()

    def close(self) -> None:
        """Close the launcher's channel: it stops any server left and exits."""
        process, self._process = self._process, None
        channel, self._channel = self._channel, None
        if channel is not None:
            channel.close()
        if process is None:
            return
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            signal_group(process.pid, signal.SIGKILL)
            process.wait()


# The launchers ``tuner run --launcher`` offers, by name: each made from the path of its log.
# A new launcher is a class with ``launch`` and ``close`` (``Launcher``) and an entry here.
LAUNCHERS: dict[str, Callable[[Path], Launcher]] = {
    "process": lambda log: ProcessLauncher(),
    "zygote": lambda log: ZygoteLauncher(log=log),
}
AUTO = "auto"


def auto_launcher(cpu_build: bool) -> str:
    """The launcher ``auto`` picks: the process launcher on vLLM's CPU build (a fork of a
    process that imported it costs more there than it saves), the zygote elsewhere."""
    return "process" if cpu_build else "zygote"
