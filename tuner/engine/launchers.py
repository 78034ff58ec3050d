"""How a vLLM server process comes to be: a fresh interpreter, or a fork of a warm zygote.

A ``Launcher`` starts a server process as its own process group and hands back a
``ServerProcess``; ``tuner.engine.process`` decides when, with what arguments, and stops it.
The process runs one of two modules: vLLM's ``api_server`` (``SERVER_MODULE``), one API server
in that process, or ``vllm serve`` (``SERVE_MODULE``), which starts as many API server
processes as ``api-server-count`` says; the caller says which (``serve_command``).

A server's process group stays in tuner's session. Linux's scheduler (with autogroup, the default
on desktop and server distributions) shares the CPU between sessions first and between the
processes of a session second. A server in a session of its own once held tuner's client, which
sleeps between requests, for 2 to 4 s at a time on a 2-core machine with two busy processes in
tuner's session; in tuner's session the client was late by at most 0.04 s
(benchmarks/results/cpu-client-lag/).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
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

from tuner.engine.zygote import Channel, die_with

logger = logging.getLogger(__name__)

# vLLM's OpenAI server: one API server, in the process that runs it.
SERVER_MODULE = "vllm.entrypoints.openai.api_server"
# ``vllm serve`` (tuner.engine.serve): with api-server-count above 1, the engine core and that
# many API server processes, all in the process group of the one that runs it.
SERVE_MODULE = "tuner.engine.serve"


class EngineFailed(Exception):
    """The server exited or did not become healthy; ``log_tail`` says why."""

    def __init__(self, reason: str, log_tail: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.log_tail = log_tail


def _read_end(path: Path, limit_bytes: int) -> str | None:
    """A log's last ``limit_bytes``, decoded; None if it cannot be read."""
    try:
        with path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - limit_bytes))
            return handle.read().decode(errors="replace")
    except OSError:
        return None


def tail(path: Path, lines: int = 40) -> str:
    """The last ``lines`` lines of a log (read from its last 64 KiB); "" if it cannot be read."""
    text = _read_end(path, 64 * 1024)
    return "" if text is None else "\n".join(text.splitlines()[-lines:])


# An exception's last line as Python prints it, after whatever prefix a log line carries
# (vLLM's "(Worker pid=...) ERROR ... [file.py:123] "): "ValueError: Available memory ...".
_EXCEPTION_LINE = re.compile(
    r"(?:^|[\s\]])((?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception): \S.*)$"
)


def first_error(path: Path, limit_bytes: int = 1 << 20) -> str | None:
    """The first exception line in a log (read from its last ``limit_bytes``), or None.

    vLLM's processes each print their traceback as the failure travels up (worker, engine core,
    API server), so the last lines of the log say "Engine core initialization failed. See root
    cause above"; the first exception line is the root cause."""
    text = _read_end(path, limit_bytes)
    for line in (text or "").splitlines():
        found = _EXCEPTION_LINE.search(line)
        if found:
            return found.group(1).strip()
    return None


def ended(code: int) -> str:
    """A process's end, from ``Popen.returncode``."""
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by signal {-code}, {signal.Signals(-code).name}"
        return f"killed by signal {-code}"
    return f"exited with status {code}"


class ServerProcess:
    """A server started as tuner's child: its pid (also its process group) and its exit code."""

    def __init__(self, pid: int, popen: subprocess.Popen[bytes] | None) -> None:
        self.pid = pid
        self._popen = popen

    def poll(self) -> int | None:
        """The server's exit status once it has exited and the status is known; else None."""
        assert self._popen is not None
        return self._popen.poll()

    def running(self) -> bool:
        """Whether the server process is still there."""
        return self.poll() is None

    def lost(self) -> EngineFailed | None:
        """Why the server cannot go on though it has not exited (its launcher died), or None."""
        return None

    def wait(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the process to end; whether it has."""
        deadline = time.monotonic() + timeout_s
        while (running := self.running()) and time.monotonic() < deadline:
            time.sleep(0.05)
        return not running


class Launcher(Protocol):
    """Starts vLLM server processes, each its own process group.

    ``launch`` runs ``argv`` with the launcher's ``module``, or with its ``serve_module`` where
    ``serve_command`` is true; its output goes to ``log``, ``env`` over tuner's environment.
    """

    def launch(
        self, argv: Sequence[str], log: Path, env: Mapping[str, str], serve_command: bool = False
    ) -> ServerProcess: ...

    def close(self) -> None: ...


def spawn(argv: Sequence[str], out: IO[bytes], env: Mapping[str, str]) -> ServerProcess:
    """Start ``argv`` as a server writing to ``out`` (its log): its own process group (stopped
    as one; Ctrl-C at the terminal reaches tuner only), in tuner's session (the module's
    docstring says why), dying with tuner. ``OSError`` where it cannot be run."""
    popen = subprocess.Popen(
        list(argv),
        stdout=out,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env={**os.environ, **env},
        process_group=0,
        preexec_fn=die_with(os.getpid()),
    )
    return ServerProcess(popen.pid, popen)


@dataclass
class ProcessLauncher:
    """A fresh interpreter per server: ``python -m vllm.entrypoints.openai.api_server``, or
    ``python -m tuner.engine.serve`` (``vllm serve``)."""

    module: str = SERVER_MODULE
    python: str = sys.executable
    serve_module: str = SERVE_MODULE

    def launch(
        self, argv: Sequence[str], log: Path, env: Mapping[str, str], serve_command: bool = False
    ) -> ServerProcess:
        module = self.serve_module if serve_command else self.module
        with log.open("ab") as out:
            return spawn([self.python, "-m", module, *argv], out, env)

    def close(self) -> None:
        pass


# How long a new zygote may take to import the server module and say it is ready. vLLM's import
# took about 23 s on the H100 and 25 s on two shared CPU cores, and a first import after an
# install (bytecode compiled afresh) or from a cold disk is slower. Generous, yet well under a
# health timeout, which a zygote that hangs on its import would otherwise cost every trial.
READY_TIMEOUT_S = 300.0
# How long a ready zygote may take to answer a launch. It forks and replies, which takes
# milliseconds, and looks at its channel every 0.2 s: a zygote this late is stuck.
REPLY_TIMEOUT_S = 30.0


class ForkedServer(ServerProcess):
    """A server the zygote forked. Not tuner's child: its exit status is a file the zygote writes
    when it reaps it, whether it runs is read from a pidfd, and a dead zygote loses it."""

    def __init__(self, pid: int, status: Path, zygote: subprocess.Popen[bytes], logs: list[Path]):
        super().__init__(pid, None)
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

    def lost(self) -> EngineFailed | None:
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

    def launch(
        self, argv: Sequence[str], log: Path, env: Mapping[str, str], serve_command: bool = False
    ) -> ServerProcess:
        process, _ = self._ensure_started()
        module = self.serve_module if serve_command else self.module
        status = log.with_name(log.name + ".exit")
        status.unlink(missing_ok=True)
        request = {
            "module": module,
            "argv": list(argv),
            "log": str(log),
            "env": dict(env),
            "status": str(status),
        }
        # A module the zygote has not imported yet, it imports before it forks.
        timeout_s = self.reply_timeout_s if module in self._imported else self.ready_timeout_s
        reply = self._exchange(request, timeout_s, "it forked the server")
        self._imported.add(module)
        logs = [log] if self.log is None else [log, self.log]
        return ForkedServer(int(reply["pid"]), status, process, logs)

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


def signal_group(pgid: int, sig: signal.Signals) -> None:
    """Send ``sig`` to process group ``pgid``; a group already gone is no error."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)
