"""A server process of this machine, as a ``ServerHandle``: ``LocalServer``.

It listens on 127.0.0.1 (``LOCAL_HOST``) and a port free when it was started, runs as its own
process group and writes its output to a log file. Stopping it sends SIGTERM to the group, then
SIGKILL to whatever is left, so no engine process outlives it; the launcher that started it
(``tuner.engine.launchers``) made it die with tuner.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from tuner.engine.handle import EngineFailed, LogMark, ServerHandle

logger = logging.getLogger(__name__)

# Where a server of this machine listens: reached by tuner alone.
LOCAL_HOST = "127.0.0.1"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the server binds it next)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOCAL_HOST, 0))
        return int(sock.getsockname()[1])


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


def signal_group(pgid: int, sig: signal.Signals) -> None:
    """Send ``sig`` to process group ``pgid``; a group already gone is no error."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


class LocalServer(ServerHandle):
    """A server started as tuner's child, listening on ``LOCAL_HOST`` at ``port``: its pid (also
    its process group), its exit status from ``popen``, its output in the file ``log``."""

    def __init__(
        self,
        pid: int,
        popen: subprocess.Popen[bytes] | None,
        port: int,
        log: Path,
        name: str = "vLLM",
        health_path: str = "/health",
        launched_at: float | None = None,
    ) -> None:
        super().__init__(name, health_path, launched_at)
        self.pid = pid
        self.port = port
        self.log = log
        self._popen = popen
        self._stopped = False

    @property
    def base_url(self) -> str:
        return f"http://{LOCAL_HOST}:{self.port}"

    @property
    def where(self) -> str:
        return f"pid {self.pid}"

    def poll(self) -> int | None:
        """The server's exit status once it has exited and the status is known; else None."""
        assert self._popen is not None
        return self._popen.poll()

    def running(self) -> bool:
        """Whether the server process is still there."""
        return self.poll() is None

    def launcher_lost(self) -> EngineFailed | None:
        """Why the server cannot go on though it has not exited (its launcher died), or None."""
        return None

    def wait(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the process to end; whether it has."""
        deadline = time.monotonic() + timeout_s
        while (running := self.running()) and time.monotonic() < deadline:
            time.sleep(0.05)
        return not running

    def failed_to_start(self) -> EngineFailed | None:
        code = self.poll()
        if code is not None:
            cause = first_error(self.log)
            return EngineFailed(
                f"{self.name} exited with status {code} before it was healthy"
                + (f" ({cause})" if cause else ""),
                tail(self.log),
            )
        return self.launcher_lost()

    def lost(self) -> EngineFailed | None:
        lost = self.launcher_lost()
        if lost is not None or self.running():
            return lost
        code = self.poll()
        how = "has exited" if code is None else ended(code)
        return EngineFailed(f"{self.name} {how}", tail(self.log))

    def stop(self, grace_s: float = 20.0) -> None:
        """SIGTERM to the process group, then SIGKILL to what is left of it after ``grace_s``."""
        if self._stopped:
            return
        self._stopped = True
        with _signals_deferred():
            signal_group(self.pid, signal.SIGTERM)
            if not self.wait(grace_s):
                logger.warning("%s did not stop within %.0f s; killing it", self.name, grace_s)
            # Engine-core workers can outlive the API server; the group kill takes them too,
            # and every API server process of ``vllm serve``.
            signal_group(self.pid, signal.SIGKILL)
            self.wait(30.0)

    def mark(self) -> LogMark:
        try:
            return LogMark(self.log.stat().st_size)
        except OSError:
            return LogMark(0)

    def log_since(self, mark: LogMark | None = None, until: LogMark | None = None) -> str:
        try:
            with self.log.open("rb") as handle:
                handle.seek(mark or 0)
                size = -1 if until is None else max(0, until - (mark or 0))
                return handle.read(size).decode(errors="replace")
        except OSError:
            return ""

    def log_tail(self, lines: int = 40) -> str:
        return tail(self.log, lines)


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
