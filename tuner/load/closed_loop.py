"""Closed loop: keep a concurrency trace's number of requests in flight.

Where only concurrency was recorded (``tuner.traces.concurrency``), each request is sent when a
slot frees, with lengths drawn from a length source. A ``Sender`` of ``tuner.load.session``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace

from tuner.load.http import Clock, ReplaySettings, body_of
from tuner.load.metrics import ReplayResult, RequestResult
from tuner.load.session import Monitor, ReplaySession, Sender, replay_async, run
from tuner.traces.concurrency import ConcurrencyTrace
from tuner.traces.model import Request

logger = logging.getLogger(__name__)


class _Slots:
    """The closed loop's slots: a request in flight holds one, and a failed request keeps it
    for ``error_backoff_s`` more; ``wake`` is set whenever one frees."""

    def __init__(self, error_backoff_s: float, wake: asyncio.Event) -> None:
        self.loop = asyncio.get_running_loop()
        self.wake = wake
        self.error_backoff_s = error_backoff_s
        self.in_flight: set[asyncio.Task[RequestResult]] = set()
        self.cooling = 0

    @property
    def held(self) -> int:
        return len(self.in_flight) + self.cooling

    def hold(self, task: asyncio.Task[RequestResult]) -> None:
        task.add_done_callback(self._finished)
        self.in_flight.add(task)

    def _cooled(self) -> None:
        self.cooling -= 1
        self.wake.set()

    def _finished(self, task: asyncio.Task[RequestResult]) -> None:
        self.in_flight.discard(task)
        if not task.cancelled() and task.exception() is None and task.result().error:
            self.cooling += 1
            self.loop.call_later(self.error_backoff_s, self._cooled)
        else:
            self.wake.set()


@dataclass
class ClosedLoop(Sender):
    """Keep ``schedule.target_at(t)`` requests in flight until ``schedule.end_s``.

    A request is sent whenever fewer than the target are in flight: at the start, when one
    finishes, and when the target rises. When it falls, nothing new is sent until enough have
    finished. Each request's ``scheduled_s`` is its send time. A failed request holds its slot
    for ``error_backoff_s``, so that a server refusing everything is not flooded.
    """

    schedule: ConcurrencyTrace
    requests: Iterator[Request]
    error_backoff_s: float = 0.1

    async def send(self, session: ReplaySession) -> None:
        slots = _Slots(self.error_backoff_s, session.wake)
        await session.begin()
        sent = 0
        stopped, end_s = session.stopped, self.schedule.end_s
        while (now := session.clock() - session.start) < end_s and not stopped.is_set():
            while slots.held < self.schedule.target_at(now):
                request = replace(next(self.requests), arrival_s=now)
                body = body_of(sent, request, session.settings)
                slots.hold(session.send(sent, request, body, now))
                sent += 1
            slots.wake.clear()
            wait_s = self.schedule.next_change_s(now) - (session.clock() - session.start)
            if wait_s > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(slots.wake.wait(), timeout=wait_s)
        logger.info("closed loop: %d requests sent over %.1f s", sent, now)


def replay_closed_loop(
    base_url: str,
    schedule: ConcurrencyTrace,
    requests: Iterator[Request],
    settings: ReplaySettings,
    clock: Clock = time.perf_counter,
    monitor: Monitor | None = None,
) -> ReplayResult:
    """Replay ``schedule`` closed-loop (``ClosedLoop``) with ``requests``' lengths, then drain;
    with a ``monitor``, stopped early once it says so, as the open loop is."""
    return run(replay_async(base_url, ClosedLoop(schedule, requests), settings, clock, monitor))
