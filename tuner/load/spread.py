"""Spread: an open-loop replay from several client processes, for rates one process cannot keep.

A ``Sender`` of ``tuner.load.session``. Each process (``spawn``: a fresh interpreter, its own
event loop and connections) sends every N-th request of the window in a session of its own
(``tuner.load.open_loop``), and all start at one instant: ``time.perf_counter`` reads the
system's monotonic clock, the same in every process. This process's session reads vLLM's
``/metrics`` around the window, takes in what the others report while it runs (so that the
monitor sees every request), tells them to stop when the monitor says so, and gathers what
they sent: the figures are those one process would have recorded, had it kept up.
"""

from __future__ import annotations

import asyncio
import logging
import math
import multiprocessing
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from typing import Any

from tuner.load.http import ReplaySettings
from tuner.load.metrics import LiveRequest, ReplayResult
from tuner.load.open_loop import OpenLoop, bodies_of
from tuner.load.session import Monitor, ReplaySession, Sender, replay_async, run
from tuner.traces.model import Request

logger = logging.getLogger(__name__)

# The processes are told the start instant this long after the last one said it was ready.
START_MARGIN_S = 0.2
READY_TIMEOUT_S = 120.0
POLL_S = 0.02
# A client process tells the parent what changed this often.
REPORT_S = POLL_S * 5

# Streamed events a second one client process reads faithfully (its TTFT p95 within 5 ms):
# ``benchmarks/results/replay-fidelity/``, a 2-core VM with the stand-in server on the other
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
    many as ``procs_for`` says), and wait for all of them to finish; stopped early once
    ``monitor`` says so."""
    procs = settings.client_procs or procs_for(requests, os.cpu_count() or 1)
    indexed = list(enumerate(requests))
    sender = Spread(indexed, procs) if procs > 1 else OpenLoop(indexed)
    spread = replace(settings, client_procs=procs)
    return run(replay_async(base_url, sender, spread, monitor=monitor))


@dataclass(frozen=True)
class Spread(Sender):
    """Send each ``(index, request)`` at its arrival time from ``procs`` client processes, the
    k-th taking every ``procs``-th request from the k-th on."""

    requests: Sequence[tuple[int, Request]]
    procs: int

    async def send(self, session: ReplaySession) -> None:
        context = multiprocessing.get_context("spawn")
        pipes, processes = [], []
        for k in range(self.procs):
            mine, theirs = context.Pipe()
            share = list(self.requests[k :: self.procs])
            args = (theirs, session.base_url, share, session.settings)
            process = context.Process(target=_child, args=args, daemon=True)
            process.start()
            theirs.close()
            pipes.append(mine)
            processes.append(process)
        finished = False
        try:
            await _ready(pipes, READY_TIMEOUT_S)
            await session.begin(margin_s=START_MARGIN_S)
            for pipe in pipes:
                pipe.send(("start", session.start))
            await _conduct(session, pipes, processes)
            finished = True
        finally:
            # Done, they exit on their own; interrupted or failed, they are killed at once.
            for process in processes:
                process.join(timeout=10 if finished else 0)
                if process.is_alive():
                    process.kill()
                    process.join()


async def _conduct(session: ReplaySession, pipes: list[Connection], processes: list[Any]) -> None:
    """Take in what the client processes report until each has sent its share; tell them all to
    stop once the session is stopped."""
    done: set[int] = set()
    told = False
    while len(done) < len(pipes):
        await asyncio.sleep(POLL_S)
        _read(pipes, session, done)
        for k, process in enumerate(processes):
            if k not in done and not process.is_alive() and not pipes[k].poll():
                raise RuntimeError(f"client process {k} exited ({process.exitcode})")
        if session.stopped.is_set() and not told:
            told = True
            for k, pipe in enumerate(pipes):
                if k not in done:
                    pipe.send(("stop", None))


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


def _read(pipes: list[Connection], session: ReplaySession, done: set[int]) -> None:
    for k, pipe in enumerate(pipes):
        while k not in done and pipe.poll():
            kind, payload = pipe.recv()
            if kind == "live":
                for i, *state in payload:
                    session.live[i] = LiveRequest(*state)
            elif kind == "done":
                session.gather(payload)
                done.add(k)
            elif kind == "error":
                raise RuntimeError(f"client process {k} failed: {payload}")


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
    """Send ``share`` from the start instant the parent tells, reporting what changes every
    ``REPORT_S`` and stopping when told; then what it sent."""
    bodies = bodies_of(share, settings)
    pipe.send(("ready", None))
    while not pipe.poll():
        await asyncio.sleep(POLL_S / 4)
    _, start = pipe.recv()
    reporting = replace(settings, monitor_interval_s=REPORT_S)
    reporter = _Reporter(pipe, share)
    opened = ReplaySession.opened(base_url, reporting, monitor=reporter, read_metrics=False)
    async with opened as session:
        await OpenLoop(share, at=start, bodies=bodies).send(session)
        await session.drain()
    pipe.send(("done", session.own()))


class _Reporter:
    """A client process's monitor: tells the parent what changed since it last told, and stops
    the replay once the parent says stop."""

    def __init__(self, pipe: Connection, share: list[tuple[int, Request]]) -> None:
        self.pipe, self.share = pipe, share
        self.told: dict[int, tuple[Any, ...]] = {}

    def __call__(self, elapsed_s: float, live: Sequence[LiveRequest]) -> bool:
        changed = []
        for (i, _), r in zip(self.share, live, strict=False):
            state = (i, r.sent_s, r.first_token_s, r.done_s, r.sent, r.scheduled_s, r.output_tokens)
            if self.told.get(i) != state:
                self.told[i] = state
                changed.append(state)
        if changed:
            self.pipe.send(("live", changed))
        stop = False
        while self.pipe.poll():
            stop = stop or self.pipe.recv()[0] == "stop"
        return stop
