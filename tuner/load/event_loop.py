"""The event loop a process of tuner's runs on, and the open files it may hold: for the replay
session and for the stand-in server alike. Standard library only (uvloop where installed), so
that importing it costs a process nothing it did not already pay."""

from __future__ import annotations

import asyncio
import contextlib
import resource
from collections.abc import Callable

# Open files a replay asks to be allowed, where the system's hard limit lets it: one connection
# per request in flight, and a window or its priming can hold thousands (many systems allow a
# process 1,024 unless it asks; vLLM's own server asks for 65,535).
OPEN_FILES = 65_536


def open_files() -> int:
    """Raise this process's limit of open files (its soft ``RLIMIT_NOFILE``) to ``OPEN_FILES``
    or the hard limit, whichever is lower, where it is below; the limit now (-1: unlimited)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = OPEN_FILES if hard == resource.RLIM_INFINITY else min(OPEN_FILES, hard)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop where it is installed (it comes with vLLM; its loop cost a replay about a
    quarter less CPU than asyncio's), else None: ``asyncio.Runner``'s own."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop
