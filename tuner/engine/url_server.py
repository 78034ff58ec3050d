"""A server someone else started, reached at its URL: ``UrlServer``, and ``UrlLauncher``, which
starts nothing and hands back the one server it was given.

tuner measures such a server as it is: healthy once its health path answers 200, lost once it
stops answering there, never stopped nor restarted by tuner (``stop`` leaves it running), its
log not tuner's to read (empty). The URL is shown only through ``tuner.urls.shown_url``: a
password in it never reaches a line tuner prints or logs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from tuner.engine.handle import EngineFailed, LogMark, ServerHandle, answers
from tuner.engine.launchers import Launch
from tuner.urls import shown_url

logger = logging.getLogger(__name__)

# How long one health probe of a server that is already running may take.
PROBE_TIMEOUT_S = 10.0


class UrlServer(ServerHandle):
    """The server at ``base_url``, which tuner did not start and does not stop."""

    def __init__(
        self,
        base_url: str,
        name: str = "the server",
        health_path: str = "/health",
        launched_at: float | None = None,
    ) -> None:
        super().__init__(name, health_path, launched_at)
        self._base_url = base_url.rstrip("/")
        self._served = False

    @property
    def base_url(self) -> str:
        return self._base_url

    @property
    def where(self) -> str:
        return shown_url(self._base_url)

    def launched(self) -> str:
        return f"measuring {self.name} at {self.where} (not started by tuner)"

    def answers(self) -> bool:
        """Whether the server answers 200 at its health path now."""
        with httpx.Client(base_url=self._base_url, timeout=PROBE_TIMEOUT_S) as client:
            return answers(client, self.health_path)

    def failed_to_start(self) -> EngineFailed | None:
        return None  # it may answer yet: up to the health timeout

    def wait_healthy(
        self,
        timeout_s: float,
        since: float | None = None,
        poll_s: float = 0.25,
        on_poll: Callable[[float], None] | None = None,
    ) -> float:
        healthy_s = super().wait_healthy(timeout_s, since, poll_s, on_poll)
        self._served = True
        return healthy_s

    def lost(self) -> EngineFailed | None:
        """Once it has been healthy: whether it has stopped answering at its health path."""
        if not self._served or self.answers():
            return None
        shown = shown_url(self._base_url)
        return EngineFailed(f"{self.name} at {shown} stopped answering {self.health_path}", "")

    def stop(self, grace_s: float = 20.0) -> None:
        """Nothing: the server is not tuner's to stop."""

    def mark(self) -> LogMark:
        return LogMark(0)

    def log_since(self, mark: LogMark | None = None, until: LogMark | None = None) -> str:
        return ""

    def log_tail(self, lines: int = 40) -> str:
        return ""


@dataclass
class UrlLauncher:
    """A launcher of the one server at ``base_url``, already running: ``launch`` starts nothing,
    writes nothing (the launch's arguments are never asked for) and hands back its
    ``UrlServer``; ``EngineFailed`` where it does not answer at the launch's health path."""

    base_url: str

    def launch(self, server: Launch) -> UrlServer:
        found = UrlServer(self.base_url, server.name, server.health_path)
        if not found.answers():
            raise EngineFailed(
                f"{server.name} at {shown_url(self.base_url)} does not answer {server.health_path}",
                "",
            )
        logger.info("measuring the server at %s as it is", shown_url(self.base_url))
        return found

    def close(self) -> None:
        pass
