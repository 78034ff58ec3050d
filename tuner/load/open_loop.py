"""Open loop: each request of a trace sent at its time, whatever the server is doing.

A ``Sender`` of ``tuner.load.session``: the session streams each request (``tuner.load.http``)
and reads vLLM's ``/metrics`` around the window. Where one process cannot keep up,
``tuner.load.spread`` sends the same way from several.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from tuner.load.http import Clock, ReplaySettings, body_of
from tuner.load.metrics import ReplayResult
from tuner.load.session import Monitor, ReplaySession, Sender, replay_async, run
from tuner.traces.model import Request


@dataclass(frozen=True)
class OpenLoop(Sender):
    """Send each ``(index, request)`` (its place in the window, which picks its prompt) at its
    arrival time from the window's start: now, or ``at``, an instant agreed with other client
    processes. The requests' ``bodies`` (``bodies_of``) are built before the window begins,
    so that building them does not make its first requests late."""

    requests: Sequence[tuple[int, Request]]
    at: float | None = None
    bodies: Sequence[bytes] | None = None

    async def send(self, session: ReplaySession) -> None:
        bodies = self.bodies
        if bodies is None:
            bodies = bodies_of(self.requests, session.settings)
        session.schedule(self.requests)
        await session.begin(self.at, preopen=[r for _, r in self.requests])
        for (index, request), body in zip(self.requests, bodies, strict=True):
            if not await session.until(request.arrival_s):
                break
            session.send(index, request, body, request.arrival_s)


def bodies_of(requests: Sequence[tuple[int, Request]], settings: ReplaySettings) -> list[bytes]:
    """The JSON body of each ``(index, request)``."""
    return [body_of(i, r, settings) for i, r in requests]


def replay_in_process(
    base_url: str,
    requests: Sequence[Request],
    settings: ReplaySettings,
    clock: Clock = time.perf_counter,
    monitor: Monitor | None = None,
) -> ReplayResult:
    """Send every request at its arrival time from this one process, and wait for all of them
    to finish: for benchmarks and tests that drive a server directly. A trial's replay is
    ``tuner.load.spread.replay``, over as many client processes as the window needs."""
    sender = OpenLoop(list(enumerate(requests)))
    return run(replay_async(base_url, sender, settings, clock, monitor))
