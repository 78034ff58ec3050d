"""A long-lived launcher that imports vLLM's server once and forks one server per trial.

Run as ``python -m tuner.engine.zygote MODULE``; ``tuner.engine.launchers`` drives it over stdin
and stdout with one JSON object per line. Each request forks a child that becomes its own
session (so the engine's process-group stop works as for a plain process), points its output at
the trial's log, and runs MODULE as ``__main__`` with the trial's arguments: exactly what
``python -m MODULE --config FILE`` runs, minus the interpreter start and the imports, which the
fork inherits. When a child exits, its status is written to the file the request named. When
stdin closes (tuner exited or was killed), the children are stopped and the launcher ends.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import runpy
import select
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

_children: dict[int, Path] = {}


def _run_child(module: str, request: dict[str, Any]) -> int:
    os.setsid()
    log_fd = os.open(str(request["log"]), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    null_fd = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null_fd, 0)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.environ.update({str(k): str(v) for k, v in (request.get("env") or {}).items()})
    sys.argv = [module, *[str(a) for a in request["argv"]]]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        traceback.print_exc()
        return 1
    return 0


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


def main(module: str) -> int:
    started = time.monotonic()
    importlib.import_module(module)
    imported_s = time.monotonic() - started
    threads = threading.active_count()
    print(json.dumps({"ready": True, "import_s": imported_s, "threads": threads}), flush=True)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # tuner decides when to stop
    stdin = sys.stdin.buffer
    try:
        while True:
            readable, _, _ = select.select([stdin], [], [], 0.2)
            _reap()
            if not readable:
                continue
            line = stdin.readline()
            if not line:
                return 0
            request = json.loads(line)
            pid = os.fork()
            if pid == 0:
                os._exit(_run_child(module, request))
            _children[pid] = Path(str(request["status"]))
            print(json.dumps({"pid": pid}), flush=True)
    finally:
        _stop_children()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
