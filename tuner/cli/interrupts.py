"""Ctrl-C and SIGTERM as tuner takes them: each raises ``KeyboardInterrupt`` in the main thread,
which stops the trial (its server stopped, the trial marked FAIL) and ends the run with 130.

Python ignores an exception raised where nothing can catch it (a handler ``os.fork`` runs, a
finalizer such as aiohttp's ``ClientResponse.__del__``), printing "Exception ignored in": an
interrupt landing there would be lost, and tuner would go on measuring (seen as a ``tuner run
--gpus`` worker SIGTERMed while it started a server, and in-process as a trial that ran to its
end after Ctrl-C). ``deliver_lost_interrupts`` makes ``sys.unraisablehook`` raise such an
interrupt again, once the main thread is back out of the code that swallowed it.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import NoReturn

# Seconds after a lost interrupt before it is raised again: long enough for the code that
# swallowed it (a fork's handlers, a finalizer) to have returned.
REDELIVER_S = 0.2


def raise_interrupt(signum: int, frame: object) -> NoReturn:
    """SIGTERM's handler: stop as on Ctrl-C."""
    raise KeyboardInterrupt


class _LostInterrupts:
    """``sys.unraisablehook``: a lost ``KeyboardInterrupt`` raised again; any other exception
    handed to the hook this one replaced."""

    def __init__(self, previous: Callable[[sys.UnraisableHookArgs], object]) -> None:
        self.previous = previous

    def __call__(self, info: sys.UnraisableHookArgs) -> None:
        if not isinstance(info.exc_value, KeyboardInterrupt):
            self.previous(info)
            return
        again = threading.Timer(REDELIVER_S, _interrupt_main)
        again.daemon = True
        again.start()


def _interrupt_main() -> None:
    """SIGINT sent to this process again (its handler raises ``KeyboardInterrupt``; a real
    signal, so that a main thread blocked in a wait wakes up), or SIGTERM where SIGINT has no
    handler of Python's (a run started under ``nohup`` ignores it)."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        if callable(signal.getsignal(signum)):
            os.kill(os.getpid(), signum)
            return


def deliver_lost_interrupts() -> None:
    """From now on, an interrupt that Python would ignore is raised again (once per process)."""
    if not isinstance(sys.unraisablehook, _LostInterrupts):
        sys.unraisablehook = _LostInterrupts(sys.unraisablehook)


@contextmanager
def lost_interrupts_delivered() -> Iterator[None]:
    """``deliver_lost_interrupts`` for the block alone: for a program that runs tuner's trials
    in its own process and keeps its own ``sys.unraisablehook`` otherwise."""
    previous = sys.unraisablehook
    deliver_lost_interrupts()
    try:
        yield
    finally:
        sys.unraisablehook = previous
