"""Closed-loop replay: keep a concurrency trace's number of requests in flight.

Where only concurrency was recorded (``tuner.traces.concurrency``), each request is sent when a
slot frees, with lengths drawn from a length source.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterator
from dataclasses import replace

from tuner.load.http import Clock, ReplaySettings, request_body, send
from tuner.load.metrics import LiveRequest, RequestResult
from tuner.load.window import (
    Monitor,
    ReplayResult,
    clients,
    drain,
    run,
    unfinished,
    watch,
    why_unfinished,
)
from tuner.traces.concurrency import ConcurrencyTrace
from tuner.traces.model import Request

logger = logging.getLogger(__name__)


class _Slots:
    """The closed loop's slots: a request in flight holds one, and a failed request keeps it
    for ``error_backoff_s`` more; ``wake`` is set whenever one frees."""

    def __init__(self, error_backoff_s: float) -> None:
        self.loop = asyncio.get_running_loop()
        self.wake = asyncio.Event()
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


async def replay_closed_loop_async(
    base_url: str,
    schedule: ConcurrencyTrace,
    requests: Iterator[Request],
    settings: ReplaySettings,
    clock: Clock = time.perf_counter,
    error_backoff_s: float = 0.1,
    monitor: Monitor | None = None,
) -> ReplayResult:
    """Keep ``schedule.target_at(t)`` requests in flight until ``schedule.end_s``, then drain.

    A request is sent whenever fewer than the target are in flight: at the start, when one
    finishes, and when the target rises. When it falls, nothing new is sent until enough have
    finished. Each request's ``scheduled_s`` is its send time. A failed request holds its slot
    for ``error_backoff_s``, so that a server refusing everything is not flooded. With a
    ``monitor``, the replay stops early once it says so, as the open loop does.
    """
    async with clients(base_url, settings) as (client, observed):
        slots = _Slots(error_backoff_s)
        wake = slots.wake
        stopped = asyncio.Event()
        sent: list[tuple[Request, asyncio.Task[RequestResult]]] = []
        live: list[LiveRequest] = []
        start = clock()
        watcher = None
        if monitor is not None:
            watcher = asyncio.create_task(
                watch(monitor, live, start, clock, settings.monitor_interval_s, stopped, wake)
            )
        while (now := clock() - start) < schedule.end_s and not stopped.is_set():
            while slots.held < schedule.target_at(now):
                request = replace(next(requests), arrival_s=now)
                body = request_body(len(sent), request, settings)
                live.append(LiveRequest(sent_s=now))
                task = asyncio.create_task(send(client, body, request, now, start, clock, live[-1]))
                slots.hold(task)
                sent.append((request, task))
            wake.clear()
            wait_s = schedule.next_change_s(now) - (clock() - start)
            if wait_s > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wake.wait(), timeout=wait_s)
        tasks = [task for _, task in sent]
        pending = await drain(tasks, stopped, settings.drain_timeout_s, clock, watcher)
        duration_s = clock() - start
        stopped_at_s = duration_s if stopped.is_set() else None
    why = why_unfinished(stopped_at_s is not None, settings)
    results = [
        task.result() if task not in pending else unfinished(request, request.arrival_s, why)
        for request, task in sent
    ]
    logger.info("closed loop: %d requests over %.1f s", len(results), duration_s)
    return observed.result(results, duration_s, stopped_at_s, live)


def replay_closed_loop(
    base_url: str,
    schedule: ConcurrencyTrace,
    requests: Iterator[Request],
    settings: ReplaySettings,
    clock: Clock = time.perf_counter,
    monitor: Monitor | None = None,
) -> ReplayResult:
    """Blocking wrapper around ``replay_closed_loop_async``."""
    return run(
        replay_closed_loop_async(base_url, schedule, requests, settings, clock, monitor=monitor)
    )
