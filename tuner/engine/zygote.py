"""A long-lived launcher that imports vLLM's server once and forks one server per trial.

Run as ``python -m tuner.engine.zygote MODULE FD``. FD is this end of a Unix socket pair whose
other end ``tuner.engine.launchers`` holds: a private ``Channel`` carrying one JSON object per
line and nothing else. The zygote's stdout and stderr, where vLLM logs while it is imported, are
the launcher log, so nothing printed there can be taken for a reply.

Each request forks a child that becomes its own session (so the engine's process-group stop
works as for a plain process), points its output at the trial's log, and runs the request's
module (MODULE where it names none) as ``__main__`` with the trial's arguments: exactly what
``python -m MODULE --config FILE`` runs, minus the interpreter start and the imports, which the
fork inherits. A module other than MODULE is imported by the zygote itself the first time a
request names it, before it forks, so later forks inherit it too. When a child exits, its
status is written to the file the request named. When the channel closes (tuner exited or was
killed), the children are stopped and the launcher ends. When the zygote itself dies, the
kernel sends each child SIGTERM (Linux's parent-death signal), so no server outlives it.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import importlib
import json
import os
import runpy
import select
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

# prctl(2) option: the signal a process gets when the thread that forked it exits.
_PR_SET_PDEATHSIG = 1
# Looked up before any fork: a child between fork and exec should do as little as it can.
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None

_children: dict[int, Path] = {}

# A folder where a forked server keeps the Triton kernels it compiles, shared by every compile
# key (vLLM's own cache is a folder per key); opt-in, for the GPU start-up A/B
# (benchmarks/results/h100-start-steps/).
SHARED_TRITON_CACHE = "TUNER_TRITON_CACHE_DIR"


def share_triton_cache(folder: str | None) -> bool:
    """Point this process's Triton cache at ``folder``; False where there is none or no Triton."""
    if not folder:
        return False
    try:
        from triton import knobs
    except ImportError:
        return False
    Path(folder).mkdir(parents=True, exist_ok=True)
    knobs.cache.dir = folder
    return True


class Channel:
    """JSON objects, one per line, over a connected Unix stream socket."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._buffer = b""

    def send(self, message: Mapping[str, Any]) -> None:
        self.sock.settimeout(None)
        self.sock.sendall(json.dumps(message).encode() + b"\n")

    def has_line(self) -> bool:
        return b"\n" in self._buffer

    def receive(self, timeout_s: float | None) -> dict[str, Any] | None:
        """The next object; None once the other end has closed.

        Raises ``TimeoutError`` when no whole line came within ``timeout_s`` (None: no limit).
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not self.has_line():
            if deadline is not None:
                remaining_s = deadline - time.monotonic()
                if remaining_s <= 0:
                    raise TimeoutError(f"no reply within {timeout_s:g} s")
                self.sock.settimeout(remaining_s)
            else:
                self.sock.settimeout(None)
            try:
                chunk = self.sock.recv(65536)
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                return None
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return dict(json.loads(line))

    def close(self) -> None:
        self.sock.close()


def die_with(parent: int) -> Callable[[], None]:
    """What a server runs once forked, before it runs anything else: the kernel is to send it
    SIGTERM when the thread that started it (tuner's, or the zygote) ends, even by SIGKILL
    (Linux's parent-death signal, which ``exec`` keeps); if ``parent`` is gone already, it
    exits at once. Used as ``preexec_fn`` by tuner's process launcher and by the zygote.

    SIGTERM, not SIGKILL: vLLM's server stops its engine-core processes on SIGTERM. Elsewhere
    than Linux, a server whose parent was killed runs on until its process group is stopped.
    """
    prctl = _LIBC.prctl if _LIBC is not None else None

    def die_with_parent() -> None:
        if prctl is not None:
            prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
        if os.getppid() != parent:  # it died before the signal was asked for
            os._exit(1)

    return die_with_parent


def _run_child(module: str, request: dict[str, Any]) -> int:
    os.setpgid(0, 0)  # its own process group, in tuner's session (tuner.engine.launchers)
    log_fd = os.open(str(request["log"]), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    null_fd = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null_fd, 0)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.environ.update({str(k): str(v) for k, v in (request.get("env") or {}).items()})
    if share_triton_cache(os.environ.get(SHARED_TRITON_CACHE)):
        print(f"tuner: Triton's cache: {os.environ[SHARED_TRITON_CACHE]}", flush=True)
    sys.argv = [module, *[str(a) for a in request["argv"]]]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        traceback.print_exc()
        return 1
    finally:
        # What the interpreter runs at exit and the child's ``os._exit`` would skip: the exit
        # handlers, those registered while the zygote imported MODULE included, as in a process
        # of its own. ``vllm serve`` removes its Prometheus folder there (under /tmp, one per
        # server of several API server processes).
        atexit._run_exitfuncs()
    return 0


def _import(module: str) -> str | None:
    """Import ``module`` into the zygote, where it is not yet; why that failed, or None."""
    if module in sys.modules:
        return None
    started = time.monotonic()
    try:
        importlib.import_module(module)
    except Exception as exc:  # the request fails, not the zygote
        traceback.print_exc()
        return f"importing {module} failed: {exc!r}"
    print(f"tuner: imported {module} in {time.monotonic() - started:.1f} s", flush=True)
    return None


def _fork(module: str, request: dict[str, Any], channel: Channel) -> dict[str, Any]:
    """Fork a server for ``request``; the reply for tuner: its pid, or why there is none.

    ``module`` runs unless the request names another (``"module"``)."""
    module = str(request.get("module") or module)
    if (failed := _import(module)) is not None:
        return {"error": failed}
    zygote = os.getpid()
    # What the zygote has buffered belongs in its own log, not in the child's.
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        pid = os.fork()
    except OSError as exc:
        return {"error": f"fork failed: {exc}"}
    if pid == 0:
        code = 1
        try:
            die_with(zygote)()
            # The child holds no end of the channel: when the zygote dies, tuner reads its end.
            channel.close()
            # What ``python -m MODULE`` starts with; the zygote ignores SIGINT.
            signal.signal(signal.SIGINT, signal.default_int_handler)
            code = _run_child(module, request)
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    _children[pid] = Path(str(request["status"]))
    return {"pid": pid}


def _reap() -> None:
    while _children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        path = _children.pop(pid, None)
        if path is not None:
            tmp = path.with_suffix(".tmp")
            tmp.write_text(str(os.waitstatus_to_exitcode(status)))
            tmp.replace(path)


def _stop_children() -> None:
    for pid in list(_children):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + 20
    while _children and time.monotonic() < deadline:
        _reap()
        time.sleep(0.1)
    for pid in list(_children):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
    while _children:
        _reap()
        time.sleep(0.05)


def main(module: str, channel_fd: int) -> int:
    channel = Channel(socket.socket(fileno=channel_fd))
    started = time.monotonic()
    importlib.import_module(module)
    imported_s = time.monotonic() - started
    threads = threading.active_count()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # tuner decides when to stop
    try:
        channel.send({"ready": True, "import_s": imported_s, "threads": threads})
        while True:
            if not channel.has_line():
                readable, _, _ = select.select([channel.sock], [], [], 0.2)
                _reap()
                if not readable:
                    continue
            request = channel.receive(timeout_s=None)
            if request is None:
                return 0
            channel.send(_fork(module, request, channel))
    except BrokenPipeError:
        return 0  # tuner is gone
    finally:
        _stop_children()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2])))
