"""A server as tuner's code sees it, whoever started it and wherever it runs: a ``ServerHandle``.

A launcher (``tuner.engine.launchers``) starts a server and hands back its handle; the rest of
tuner asks the handle where the server answers (``base_url``), waits for it to serve
(``wait_healthy``), asks whether it still can (``lost``, ``alive``), reads its log from a mark on
(``mark``, ``log_since``, ``log_tail``) and stops it (``stop``). Processes, process groups, ports
and log files stay behind the handle, as sockets stay behind an HTTP client's transport: a server
of this machine (``tuner.engine.local``), one that tuner's zygote forked, or one that someone
else started at a URL (``tuner.engine.url_server``) are handles alike.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import NewType

import httpx

# A position in a server's log, from ``ServerHandle.mark``: opaque, only given back to
# ``ServerHandle.log_since``.
LogMark = NewType("LogMark", int)


class EngineFailed(Exception):
    """The server exited or did not become healthy; ``log_tail`` says why."""

    def __init__(self, reason: str, log_tail: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.log_tail = log_tail


def answers(client: httpx.Client, path: str) -> bool:
    """Whether the server of ``client`` answers 200 at ``path`` now."""
    try:
        return client.get(path).status_code == 200
    except httpx.HTTPError:
        return False


class ServerHandle(ABC):
    """One server tuner measures.

    ``name`` is what tuner's lines call it ("vLLM", "your server"), ``health_path`` the path that
    answers 200 once it serves, ``launched_at`` when its launch began (``time.monotonic()``;
    None: now). ``wait_healthy`` is called once, after the launch; ``lost`` and the log at any
    time; ``stop`` last, and again without harm. The log methods read what the server wrote
    where tuner can read it: a server tuner did not start has none (``""``).
    """

    def __init__(self, name: str, health_path: str, launched_at: float | None = None) -> None:
        self.name = name
        self.health_path = health_path
        self.launched_at = time.monotonic() if launched_at is None else launched_at

    @property
    @abstractmethod
    def base_url(self) -> str:
        """Where the server answers HTTP: ``scheme://host:port`` (and a path, if it has one)."""

    @property
    @abstractmethod
    def where(self) -> str:
        """What tuner's lines say of where the server runs: ``pid 4321``, or its URL (masked)."""

    def launched(self) -> str:
        """What tuner's lines say once the server is launched: ``starting vLLM (pid 4321)``."""
        return f"starting {self.name} ({self.where})"

    @abstractmethod
    def lost(self) -> EngineFailed | None:
        """Why the server can serve no more (it exited, its launcher died, it stopped
        answering), with its log's tail; None while it can."""

    @abstractmethod
    def stop(self, grace_s: float = 20.0) -> None:
        """Stop the server, if it is tuner's to stop; a second call does nothing."""

    @abstractmethod
    def mark(self) -> LogMark:
        """The log's position now: ``log_since`` reads what comes after it."""

    @abstractmethod
    def log_since(self, mark: LogMark | None = None, until: LogMark | None = None) -> str:
        """The log from ``mark`` (None: its start) to ``until`` (None: now), decoded."""

    @abstractmethod
    def log_tail(self, lines: int = 40) -> str:
        """The log's last ``lines`` lines; "" where it has none tuner can read."""

    def alive(self) -> bool:
        """Whether the server can still serve."""
        return self.lost() is None

    def failed_to_start(self) -> EngineFailed | None:
        """Why the server will never be healthy, asked between health polls; None while it may
        still be. By default, what ``lost`` says."""
        return self.lost()

    def wait_healthy(
        self,
        timeout_s: float,
        since: float | None = None,
        poll_s: float = 0.25,
        on_poll: Callable[[float], None] | None = None,
    ) -> float:
        """Block until ``health_path`` answers 200; the seconds since ``since`` (None:
        ``launched_at``).

        ``EngineFailed`` with the log's tail where the server fails to start
        (``failed_to_start``) or is not healthy ``timeout_s`` after ``since``. ``on_poll`` is
        told the seconds since ``since`` after each unanswered poll.
        """
        began = self.launched_at if since is None else since
        with httpx.Client(base_url=self.base_url, timeout=5.0) as client:
            while True:
                failed = self.failed_to_start()
                if failed is not None:
                    raise failed
                if answers(client, self.health_path):
                    return time.monotonic() - began
                if time.monotonic() > began + timeout_s:
                    raise EngineFailed(
                        f"{self.name} was not healthy within {timeout_s:g} s", self.log_tail()
                    )
                if on_poll is not None:
                    on_poll(time.monotonic() - began)
                time.sleep(poll_s)
