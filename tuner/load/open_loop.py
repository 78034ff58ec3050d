"""Open-loop replay of a trace against an OpenAI-compatible ``/v1/completions`` endpoint.

Each request is sent at its trace time, whatever the server is doing, and streamed
(``tuner.load.http``); vLLM's ``/metrics`` is read around the window (``tuner.load.window``).
Where one process cannot keep up, ``tuner.load.spread`` runs the same loop in several.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

import httpx

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
from tuner.traces.model import Request


async def send_all(
    client: httpx.AsyncClient,
    requests: Sequence[tuple[int, Request]],
    settings: ReplaySettings,
    start: float,
    clock: Clock,
    stopped: asyncio.Event,
    live: list[LiveRequest],
    tasks: list[asyncio.Task[RequestResult]],
) -> None:
    """Start each ``(index, request)`` at ``start`` plus its arrival time, until ``stopped``;
    ``live`` and ``tasks`` grow by one for each request started."""
    bodies = [request_body(i, r, settings) for i, r in requests]
    for (_, request), body in zip(requests, bodies, strict=True):
        # Sleep in short steps so that a stop is seen during long silences too.
        while (delay := start + request.arrival_s - clock()) > 0 and not stopped.is_set():
            await asyncio.sleep(min(delay, 1.0))
        if stopped.is_set():
            break
        live.append(LiveRequest(sent_s=request.arrival_s))
        tasks.append(
            asyncio.create_task(
                send(client, body, request, request.arrival_s, start, clock, live[-1])
            )
        )


def results_of(
    requests: Sequence[Request],
    tasks: Sequence[asyncio.Task[RequestResult]],
    pending: set[asyncio.Task[RequestResult]],
    live: Sequence[LiveRequest],
    why: str,
) -> list[RequestResult]:
    """One result per request: its own, or why it has none (not sent, cancelled)."""
    results = []
    for i, request in enumerate(requests):
        if i >= len(tasks):
            results.append(unfinished(request, None, "not sent: the replay stopped early"))
        elif tasks[i] in pending:
            results.append(unfinished(request, live[i].sent_s, why))
        else:
            results.append(tasks[i].result())
    return results


async def replay_async(
    base_url: str,
    requests: Sequence[Request],
    settings: ReplaySettings,
    clock: Clock = time.perf_counter,
    monitor: Monitor | None = None,
) -> ReplayResult:
    """Send every request at its arrival time and wait for all of them to finish.

    With a ``monitor``, the replay stops early once it says so: nothing more is sent and the
    requests in flight are cancelled.
    """
    async with clients(base_url, settings, requests=requests) as (client, observed):
        stopped = asyncio.Event()
        live: list[LiveRequest] = []
        tasks: list[asyncio.Task[RequestResult]] = []
        start = clock()
        watcher = None
        if monitor is not None:
            watcher = asyncio.create_task(
                watch(monitor, live, start, clock, settings.monitor_interval_s, stopped)
            )
        indexed = list(enumerate(requests))
        await send_all(client, indexed, settings, start, clock, stopped, live, tasks)
        pending = await drain(tasks, stopped, settings.drain_timeout_s, clock, watcher)
        duration_s = clock() - start
        stopped_at_s = duration_s if stopped.is_set() else None
    why = why_unfinished(stopped_at_s is not None, settings)
    results = results_of(requests, tasks, pending, live, why)
    return observed.result(results, duration_s, stopped_at_s, live)


def replay_in_process(
    base_url: str,
    requests: Sequence[Request],
    settings: ReplaySettings,
    clock: Clock = time.perf_counter,
    monitor: Monitor | None = None,
) -> ReplayResult:
    """Blocking wrapper around ``replay_async``, in this one process: for benchmarks and tests
    that drive a server directly. A trial's replay is ``tuner.load.spread.replay``, over as
    many client processes as the window needs."""
    return run(replay_async(base_url, requests, settings, clock, monitor))
