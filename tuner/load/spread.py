"""An open-loop replay spread over several client processes, for rates one process cannot keep.

Each process (``spawn``: a fresh interpreter, its own event loop and connections) takes every
N-th request of the window, and all start at one instant: ``time.perf_counter`` reads the
system's monotonic clock, the same in every process. This process reads vLLM's ``/metrics``
around the window, merges what the others report while it runs (so that the pruner's monitor
sees every request), tells them to stop when the monitor says so, and merges their results in
the window's order: the figures are those one process would have recorded, had it kept up.
"""

from __future__ import annotations

import asyncio
import logging
import math
import multiprocessing
import os
import time
from collections.abc import Sequence
from dataclasses import replace
from multiprocessing.connection import Connection
from typing import Any

from tuner.load.http import ReplaySettings
from tuner.load.metrics import LiveRequest, RequestResult
from tuner.load.open_loop import replay_async, results_of, send_all
from tuner.load.window import (
    Monitor,
    Observed,
    ReplayResult,
    clients,
    drain,
    run,
    why_unfinished,
)
from tuner.traces.model import Request

logger = logging.getLogger(__name__)

# The processes are told the start instant this long after the last one said it was ready.
START_MARGIN_S = 0.2
READY_TIMEOUT_S = 120.0
POLL_S = 0.02

# Streamed events a second one client process reads faithfully (its TTFT p95 within 5 ms):
# ``benchmarks/results/replay-fidelity.md``, a 2-core VM with the stand-in server on the other
# core. ``--client-procs auto`` divides a window's peak by this.
EVENTS_PER_S_PER_PROC = 10_000.0


def procs_for(
    requests: Sequence[Request], cpus: int, per_proc: float = EVENTS_PER_S_PER_PROC
) -> int:
    """Client processes for a window: its busiest second's streamed events (requests arriving in
    it times their output tokens) over what one process reads, at most half the CPUs (vLLM's
    API server needs the rest), at least one."""
    peak, low, total = 0, 0, 0
    # The busiest second by a sliding window over the arrivals, weighted by output tokens.
    ordered = sorted(requests, key=lambda r: r.arrival_s)
    for r in ordered:
        total += r.output_tokens
        while ordered[low].arrival_s <= r.arrival_s - 1.0:
            total -= ordered[low].output_tokens
            low += 1
        peak = max(peak, total)
    return max(1, min(math.ceil(peak / per_proc), max(1, cpus // 2)))


def replay(
    base_url: str,
    requests: Sequence[Request],
    settings: ReplaySettings,
    monitor: Monitor | None = None,
) -> ReplayResult:
    """Send every request at its arrival time, from ``settings.client_procs`` processes (0: as
    many as ``procs_for`` says)."""
    procs = settings.client_procs or procs_for(requests, os.cpu_count() or 1)
    if procs > 1:
        return run(_parent(base_url, requests, replace(settings, client_procs=procs), monitor))
    return run(replay_async(base_url, requests, settings, monitor=monitor))


async def _parent(
    base_url: str,
    requests: Sequence[Request],
    settings: ReplaySettings,
    monitor: Monitor | None,
) -> ReplayResult:
    context = multiprocessing.get_context("spawn")
    n = settings.client_procs
    pipes, processes = [], []
    for k in range(n):
        mine, theirs = context.Pipe()
        share = [(i, r) for i, r in enumerate(requests) if i % n == k]
        process = context.Process(
            target=_child, args=(theirs, base_url, share, settings), daemon=True
        )
        process.start()
        theirs.close()
        pipes.append(mine)
        processes.append(process)
    finished = False
    try:
        result = await _conduct(base_url, requests, settings, monitor, pipes, processes)
        finished = True
        return result
    finally:
        # Done, they exit on their own; interrupted or failed, they are killed at once.
        for process in processes:
            process.join(timeout=10 if finished else 0)
            if process.is_alive():
                process.kill()
                process.join()


async def _conduct(
    base_url: str,
    requests: Sequence[Request],
    settings: ReplaySettings,
    monitor: Monitor | None,
    pipes: list[Connection],
    processes: list[Any],
) -> ReplayResult:
    live: dict[int, LiveRequest] = {}
    done: dict[int, dict[str, Any]] = {}
    await _ready(pipes, READY_TIMEOUT_S)
    async with clients(base_url, settings) as (_, observed):
        start = time.perf_counter() + START_MARGIN_S
        for pipe in pipes:
            pipe.send(("start", start))
        stopped = False
        next_check = start + settings.monitor_interval_s
        while len(done) < len(pipes):
            await asyncio.sleep(POLL_S)
            _read(pipes, live, done)
            for k, process in enumerate(processes):
                if k not in done and not process.is_alive() and not pipes[k].poll():
                    raise RuntimeError(f"client process {k} exited ({process.exitcode})")
            now = time.perf_counter()
            if monitor is not None and not stopped and now >= next_check:
                next_check = now + settings.monitor_interval_s
                if monitor(now - start, [live[i] for i in sorted(live)]):
                    stopped = True
                    for pipe in pipes:
                        pipe.send(("stop", None))
    return _merge(requests, done, observed, live)


async def _ready(pipes: list[Connection], timeout_s: float) -> None:
    """Wait until every client process has said it is ready."""
    ready: set[int] = set()
    deadline = time.monotonic() + timeout_s
    while len(ready) < len(pipes):
        for k, pipe in enumerate(pipes):
            while k not in ready and pipe.poll():
                message = pipe.recv()
                if message[0] == "ready":
                    ready.add(k)
                elif message[0] == "error":
                    raise RuntimeError(f"client process {k} failed: {message[1]}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"client processes not ready after {timeout_s:g} s")
        await asyncio.sleep(POLL_S)


def _read(
    pipes: list[Connection], live: dict[int, LiveRequest], done: dict[int, dict[str, Any]]
) -> None:
    for k, pipe in enumerate(pipes):
        while k not in done and pipe.poll():
            kind, payload = pipe.recv()
            if kind == "live":
                for i, sent_s, first_token_s, done_s, sent in payload:
                    live[i] = LiveRequest(sent_s, first_token_s, done_s, sent)
            elif kind == "done":
                done[k] = payload
            elif kind == "error":
                raise RuntimeError(f"client process {k} failed: {payload}")


def _merge(
    requests: Sequence[Request],
    done: dict[int, dict[str, Any]],
    observed: Observed,
    live: dict[int, LiveRequest],
) -> ReplayResult:
    by_index: dict[int, RequestResult] = {}
    for report in done.values():
        by_index.update(report["results"])
    results = [by_index[i] for i in range(len(requests))]
    duration_s = max(report["duration_s"] for report in done.values())
    stops = [report["stopped_at_s"] for report in done.values()]
    stopped_at_s = duration_s if any(s is not None for s in stops) else None
    merged = observed.result(results, duration_s, stopped_at_s, [live[i] for i in sorted(live)])
    merged.client_lag_max_s = max(report["lag_max_s"] for report in done.values())
    merged.client_lag_p99_s = max(report["lag_p99_s"] for report in done.values())
    merged.client_cpu = tuple(done[k]["cpu"] for k in sorted(done))
    return merged


def _child(
    pipe: Connection,
    base_url: str,
    share: list[tuple[int, Request]],
    settings: ReplaySettings,
) -> None:
    try:
        run(_child_async(pipe, base_url, share, settings))
    except BaseException as exc:
        pipe.send(("error", f"{type(exc).__name__}: {exc}"))
        raise


async def _child_async(
    pipe: Connection, base_url: str, share: list[tuple[int, Request]], settings: ReplaySettings
) -> None:
    pipe.send(("ready", None))
    while not pipe.poll():
        await asyncio.sleep(POLL_S / 4)
    _, start = pipe.recv()
    clock = time.perf_counter
    mine = [r for _, r in share]
    async with clients(base_url, settings, False, mine) as (client, observed):
        stopped = asyncio.Event()
        live: list[LiveRequest] = []
        tasks: list[asyncio.Task[RequestResult]] = []
        reporter = asyncio.create_task(_report(pipe, share, live, stopped))
        await send_all(client, share, settings, start, clock, stopped, live, tasks)
        pending = await drain(tasks, stopped, settings.drain_timeout_s, clock, None)
        duration_s = clock() - start
        reporter.cancel()
        await asyncio.gather(reporter, return_exceptions=True)
    why = why_unfinished(stopped.is_set(), settings)
    results = results_of([r for _, r in share], tasks, pending, live, why)
    _send_live(pipe, share, live, {})
    pipe.send(
        (
            "done",
            {
                "results": [(i, result) for (i, _), result in zip(share, results, strict=True)],
                "duration_s": duration_s,
                "stopped_at_s": duration_s if stopped.is_set() else None,
                "lag_max_s": observed.client_lag_max_s,
                "lag_p99_s": observed.client_lag_p99_s,
                "cpu": observed.cpu,
            },
        )
    )


async def _report(
    pipe: Connection,
    share: list[tuple[int, Request]],
    live: list[LiveRequest],
    stopped: asyncio.Event,
) -> None:
    """Tell the parent what changed every ``POLL_S * 5``; stop when it says so."""
    told: dict[int, tuple[Any, ...]] = {}
    while True:
        await asyncio.sleep(POLL_S * 5)
        _send_live(pipe, share, live, told)
        while pipe.poll():
            if pipe.recv()[0] == "stop":
                stopped.set()


def _send_live(
    pipe: Connection,
    share: list[tuple[int, Request]],
    live: list[LiveRequest],
    told: dict[int, tuple[Any, ...]],
) -> None:
    changed = []
    for (i, _), r in zip(share, live, strict=False):
        state = (i, r.sent_s, r.first_token_s, r.done_s, r.sent)
        if told.get(i) != state:
            told[i] = state
            changed.append(state)
    if changed:
        pipe.send(("live", changed))
