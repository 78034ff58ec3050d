"""One replay window: the clients, what vLLM's ``/metrics`` said around it, when to stop.

Shared by the open loop and the closed loop. vLLM's ``/metrics`` is read before, during (for the
gauges) and after the window; tuner's own event loop is probed for lateness throughout.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx
import numpy as np

from tuner.load.http import Clock, ReplaySettings, make_client
from tuner.load.metrics import (
    LiveRequest,
    RequestResult,
    parse_scrape,
    summarize_client,
    summarize_gauges,
    summarize_server,
)
from tuner.traces.model import Request

logger = logging.getLogger(__name__)

T = TypeVar("T")

# A wall clock that moved more than this against the monotonic one over a window is reported
# (a slewing NTP daemon moves it by at most 0.5 ms a second).
WALL_CLOCK_TOLERANCE_S = 0.05

# tuner's own event loop is probed this often during a window: how late a timer fires is how late
# tuner reads what the server sent. Above the warning level, tuner's latencies include its own
# slowness (a client short of CPU), not only the server's.
LOOP_PROBE_INTERVAL_S = 0.01
LOOP_LAG_WARNING_S = 0.1
GC_THRESHOLDS = (100_000, 50, 1000)
PREOPEN_MAX = 256


# Called every ``ReplaySettings.monitor_interval_s`` (1 s: a progress display's tick; the pruner
# keeps its own, slower cadence) with the seconds since the window began and the requests sent so
# far; returning True stops the replay early (the trial is hopeless). It runs on the replay's
# event loop, so it must be quick.
Monitor = Callable[[float, Sequence[LiveRequest]], bool]


@dataclass
class ReplayResult:
    """What one replay saw: per-request results and the raw ``/metrics`` texts."""

    results: list[RequestResult]
    duration_s: float
    metrics_before: str = ""
    metrics_after: str = ""
    metrics_during: list[str] = field(default_factory=list)
    stopped_at_s: float | None = None
    live: list[LiveRequest] = field(default_factory=list)
    # How far the system's wall clock moved against the monotonic one over the window. vLLM times
    # requests with the wall clock (``time.time()``), tuner with the monotonic one; a clock set
    # during the window (NTP stepping a freshly booted machine) shifts vLLM's figures, not tuner's.
    wall_clock_step_s: float = 0.0
    # How late tuner's own event loop woke for a timer during the window: the worst, and the 99th
    # percentile. tuner's latencies include up to this much of its own delay.
    client_lag_max_s: float = 0.0
    client_lag_p99_s: float = 0.0
    # The CPU each client process spent over the window, in cores (CPU seconds per second).
    client_cpu: tuple[float, ...] = ()


async def scrape(client: httpx.AsyncClient) -> str:
    """The server's /metrics text; "" (with a warning) where it cannot be read."""
    try:
        response = await client.get("/metrics", timeout=10.0)
    except httpx.HTTPError as exc:
        logger.warning("reading /metrics failed: %s", exc)
        return ""
    return response.text if response.status_code == 200 else ""


async def probe_loop(interval_s: float, into: list[float], stop: asyncio.Event) -> None:
    """Append how late each ``interval_s`` timer fires until ``stop`` is set."""
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        due = loop.time() + interval_s
        await asyncio.sleep(interval_s)
        into.append(max(0.0, loop.time() - due))


async def sample_gauges(
    client: httpx.AsyncClient, interval_s: float, into: list[str], stop: asyncio.Event
) -> None:
    """Append a /metrics scrape to ``into`` every ``interval_s`` until ``stop`` is set."""
    while not stop.is_set():
        into.append(await scrape(client))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=interval_s)


@dataclass
class Observed:
    """vLLM's ``/metrics`` around a window: before, sampled during, after."""

    before: str
    during: list[str] = field(default_factory=list)
    after: str = ""
    wall_offset_before_s: float = field(default_factory=lambda: time.time() - time.monotonic())
    wall_offset_after_s: float | None = None
    loop_lags: list[float] = field(default_factory=list)
    cpu_before_s: float = field(default_factory=time.process_time)
    wall_before_s: float = field(default_factory=time.perf_counter)
    cpu: float = 0.0

    @property
    def wall_clock_step_s(self) -> float:
        if self.wall_offset_after_s is None:
            return 0.0
        return self.wall_offset_after_s - self.wall_offset_before_s

    @property
    def client_lag_max_s(self) -> float:
        return max(self.loop_lags, default=0.0)

    @property
    def client_lag_p99_s(self) -> float:
        lags = sorted(self.loop_lags) or [0.0]
        return lags[min(len(lags) - 1, int(0.99 * len(lags)))]

    def result(
        self,
        results: list[RequestResult],
        duration_s: float,
        stopped_at_s: float | None,
        live: list[LiveRequest],
    ) -> ReplayResult:
        """What the replay saw, with what was observed around it."""
        return ReplayResult(
            results,
            duration_s,
            self.before,
            self.after,
            self.during,
            stopped_at_s,
            live,
            self.wall_clock_step_s,
            self.client_lag_max_s,
            self.client_lag_p99_s,
            (self.cpu,),
        )


@contextlib.asynccontextmanager
async def clients(
    base_url: str,
    settings: ReplaySettings,
    scrape_metrics: bool = True,
    requests: Sequence[Request] = (),
) -> AsyncIterator[tuple[httpx.AsyncClient, Observed]]:
    """A client of the server, with its ``/metrics`` read around what runs inside (unless
    ``scrape_metrics`` is False: a client process of a replay spread over several), tuner's own
    loop probed and its CPU counted.

    For the window's length, the objects that exist before it are frozen out of the garbage
    collector's scans and its young generation is collected less often: collections held the
    loop up to 0.1 s at 300 req/s (a replay leaves about 40 objects in cycles a request, so the
    collector cannot simply be turned off for a long window).
    """
    async with make_client(base_url, settings) as client:
        # Connections for the window's first second, opened before it (``GET /health``), so
        # that its first requests do not each wait for a connection of their own.
        await asyncio.gather(
            *(client.get("/health") for _ in range(preopen(requests))), return_exceptions=True
        )
        observed = Observed(before=await scrape(client) if scrape_metrics else "")
        stop = asyncio.Event()
        sampler = None
        if scrape_metrics:
            sampler = asyncio.create_task(
                sample_gauges(client, settings.gauge_interval_s, observed.during, stop)
            )
        prober = asyncio.create_task(probe_loop(LOOP_PROBE_INTERVAL_S, observed.loop_lags, stop))
        gc.collect()
        gc.freeze()
        thresholds = gc.get_threshold()
        gc.set_threshold(*GC_THRESHOLDS)
        observed.cpu_before_s, observed.wall_before_s = time.process_time(), time.perf_counter()
        try:
            yield client, observed
        finally:
            wall_s = time.perf_counter() - observed.wall_before_s
            observed.cpu = (time.process_time() - observed.cpu_before_s) / max(wall_s, 1e-9)
            gc.set_threshold(*thresholds)
            gc.unfreeze()
            stop.set()
            await asyncio.gather(prober, *([sampler] if sampler else []))
            if scrape_metrics:
                observed.after = await scrape(client)
            observed.wall_offset_after_s = time.time() - time.monotonic()
            if abs(observed.wall_clock_step_s) > WALL_CLOCK_TOLERANCE_S:
                logger.warning(
                    "the system clock moved %+.3f s against the monotonic clock during the "
                    "window: vLLM's own latency figures are off by up to that much",
                    observed.wall_clock_step_s,
                )
            if observed.client_lag_max_s > LOOP_LAG_WARNING_S:
                logger.warning(
                    "tuner's own event loop ran up to %.3f s late during the window: its "
                    "latencies include that much of its own delay (is the machine short of CPU?)",
                    observed.client_lag_max_s,
                )


def preopen(requests: Sequence[Request], most: int = PREOPEN_MAX) -> int:
    """How many connections to open before a window: its first second's requests, at most
    ``most``."""
    if not requests:
        return 0
    first = min(r.arrival_s for r in requests)
    return min(most, sum(1 for r in requests if r.arrival_s < first + 1.0))


def run(main: Coroutine[Any, Any, T]) -> T:
    """Run a replay on its own event loop: uvloop's where it is installed (it comes with vLLM;
    its loop cost a replay about a quarter less CPU than asyncio's), else asyncio's."""
    try:
        import uvloop
    except ImportError:
        factory = None
    else:
        factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)


async def watch(
    monitor: Monitor,
    live: Sequence[LiveRequest],
    start: float,
    clock: Clock,
    interval_s: float,
    stopped: asyncio.Event,
    *wake: asyncio.Event,
) -> None:
    """Ask ``monitor`` every ``interval_s``; once it says stop, set ``stopped`` and ``wake``."""
    while not stopped.is_set():
        await asyncio.sleep(interval_s)
        if monitor(clock() - start, live):
            stopped.set()
            for event in wake:
                event.set()


async def drain(
    tasks: Sequence[asyncio.Task[RequestResult]],
    stopped: asyncio.Event,
    timeout_s: float,
    clock: Clock,
    watcher: asyncio.Task[None] | None,
) -> set[asyncio.Task[RequestResult]]:
    """Wait for ``tasks`` until all are done, ``timeout_s`` passes or a stop is asked for; cancel
    the rest, stop the watcher, and return the cancelled ones."""
    pending = {task for task in tasks if not task.done()}
    deadline = clock() + timeout_s
    while pending and not stopped.is_set() and (remaining := deadline - clock()) > 0:
        _, pending = await asyncio.wait(pending, timeout=min(remaining, 0.5))
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    if watcher is not None:
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
    return pending


def why_unfinished(stopped_early: bool, settings: ReplaySettings) -> str:
    """Why a request has no result: the replay was stopped, or the drain timed out."""
    if stopped_early:
        return "cancelled: the replay stopped early"
    return f"not finished within the {settings.drain_timeout_s:g} s drain timeout"


def unfinished(request: Request, sent_s: float | None, why: str) -> RequestResult:
    """A request that never finished, as a failed result saying ``why``."""
    return RequestResult(
        request.arrival_s,
        request.arrival_s if sent_s is None else sent_s,
        request.input_tokens,
        request.output_tokens,
        error=why,
    )


def replay_figures(result: ReplayResult) -> dict[str, float]:
    """Everything a whole replay measured: tuner's figures, vLLM's over the window, the gauges,
    and how far the wall clock and tuner's own loop were off."""
    figures = summarize_client(result.results, result.duration_s)
    before, after = parse_scrape(result.metrics_before), parse_scrape(result.metrics_after)
    figures |= summarize_server(before, after)
    figures |= summarize_gauges([parse_scrape(text) for text in result.metrics_during])
    figures["wall_clock_step_s"] = result.wall_clock_step_s
    return figures | client_figures(result)


def client_figures(result: ReplayResult) -> dict[str, float]:
    """The client's own figures of a window: processes, CPU of the busiest, and how late the
    requests' bytes were written against their schedule (``write_lag``)."""
    lags = [r.written_s - r.scheduled_s for r in result.results if r.written_s is not None]
    figures = {
        "client_procs": float(max(1, len(result.client_cpu))),
        "client_cpu_max": max(result.client_cpu, default=0.0),
        "client_lag_max_s": result.client_lag_max_s,
        "client_lag_p99_s": result.client_lag_p99_s,
    }
    if lags:
        figures["write_lag_p50_s"] = float(np.percentile(lags, 50))
        figures["write_lag_p99_s"] = float(np.percentile(lags, 99))
    return figures
