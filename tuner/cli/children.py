"""The ``tuner run`` processes a ``--gpus`` parent starts: each on its GPUs
(``CUDA_VISIBLE_DEVICES``), its command said as a person would type it, its lines relayed as
they come after a head of its own (``gpu 0 |``, ``gpus 0,1 |``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import IO

from tuner.engine.environment import Gpu
from tuner.urls import shown_command

# Seconds the children have to stop once told to: a trial's server stops within 30 s (SIGTERM to
# its group, then SIGKILL), with room for the worker's own writes to the study.
STOP_WAIT_S = 90.0


@dataclass(frozen=True)
class Child:
    """One ``tuner run`` to start: its ``argv`` (an interpreter's, ``python -m tuner.cli ...``),
    the GPUs it is given, and the head its lines are printed after (none: as they come)."""

    argv: list[str]
    gpus: tuple[Gpu, ...]
    head: str = ""

    @property
    def env(self) -> dict[str, str]:
        """This process's environment, ``CUDA_VISIBLE_DEVICES`` naming the child's GPUs."""
        return {**os.environ, "CUDA_VISIBLE_DEVICES": indices(self.gpus)}

    def said(self) -> str:
        """Its command as a person would type it, every URL's password hidden
        (``tuner.urls.shown_command``)."""
        return f"CUDA_VISIBLE_DEVICES={indices(self.gpus)} " + shown_command(
            ["tuner", *self.argv[3:]]
        )


def indices(gpus: Sequence[Gpu]) -> str:
    """``0,1``: the GPUs by nvidia-smi's index, as ``CUDA_VISIBLE_DEVICES`` names them."""
    return ",".join(str(gpu.index) for gpu in gpus)


def head_of(gpus: Sequence[Gpu]) -> str:
    """``gpu 0 | `` for one GPU, ``gpus 0,1 | `` for several: what a worker's lines follow."""
    return f"gpu{'s' if len(gpus) != 1 else ''} {indices(gpus)} | "


def run_all(children: Sequence[Child]) -> list[int]:
    """Run every child at once, printing each line it writes as it comes after its head; their
    exit statuses. Ctrl-C or SIGTERM stops them (``_stop``)."""
    lock = threading.Lock()
    procs = []
    readers = []
    try:
        for child in children:
            proc = subprocess.Popen(
                child.argv, env=child.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                bufsize=0,
            )  # fmt: skip
            procs.append(proc)
            assert proc.stdout is not None
            reader = threading.Thread(
                target=_relay, args=(proc.stdout, child.head, lock), daemon=True
            )
            reader.start()
            readers.append(reader)
        codes = [proc.wait() for proc in procs]
    except KeyboardInterrupt:
        _stop(procs)
        raise
    for reader in readers:
        reader.join(timeout=5)
    return codes


def _stop(procs: Sequence[subprocess.Popen[bytes]]) -> None:
    """SIGTERM to each child still running, as tuner stops on it (its running trial marked
    FAIL, its server stopped); one that has not ended ``STOP_WAIT_S`` later is killed, its trial
    left to its lease."""
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    deadline = time.monotonic() + STOP_WAIT_S
    for proc in procs:
        try:
            proc.wait(timeout=max(deadline - time.monotonic(), 0.0))
        except subprocess.TimeoutExpired:
            print(f"a worker (pid {proc.pid}) did not stop in {STOP_WAIT_S:.0f} s: killed; its "
                  "trial is failed once its lease runs out", file=sys.stderr)  # fmt: skip
            proc.kill()
            proc.wait()


def _relay(stream: IO[bytes], head: str, lock: threading.Lock) -> None:
    """Print ``stream``'s lines after ``head`` until it ends; a live line's redraws (``\\r``)
    are kept to their last state."""
    for raw in iter(stream.readline, b""):
        line = raw.decode(errors="replace").rstrip("\n").rpartition("\r")[2]
        with lock:
            print(head + line, flush=True)
