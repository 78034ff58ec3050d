"""One replay window: the clients, what vLLM's ``/metrics`` said around it, when to stop.

Shared by the open loop and the closed loop. vLLM's ``/metrics`` is read before, during (for the
gauges) and after the window; tuner's own event loop is probed for lateness throughout.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field

import httpx

from tuner.load.http import POOLS, Clock, ReplaySettings
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

# A wall clock that moved more than this against the monotonic one over a window is reported
# (a slewing NTP daemon moves it by at most 0.5 ms a second).
WALL_CLOCK_TOLERANCE_S = 0.05

# tuner's own event loop is probed this often during a window: how late a timer fires is how late
# tuner reads what the server sent. Above the warning level, tuner's latencies include its own
# slowness (a client short of CPU), not only the server's.
LOOP_PROBE_INTERVAL_S = 0.01
LOOP_LAG_WARNING_S = 0.1


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


async def scrape(client: httpx.AsyncClient) -> str:
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
        )


@contextlib.asynccontextmanager
async def clients(
    base_url: str, settings: ReplaySettings
) -> AsyncIterator[tuple[list[httpx.AsyncClient], Observed]]:
    """``POOLS`` clients of the server, with its ``/metrics`` read around what runs inside."""
    timeout = httpx.Timeout(settings.request_timeout_s, connect=30.0)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with contextlib.AsyncExitStack() as stack:
        pools = [
            await stack.enter_async_context(
                httpx.AsyncClient(base_url=base_url, timeout=timeout, limits=limits)
            )
            for _ in range(POOLS)
        ]
        observed = Observed(before=await scrape(pools[0]))
        stop = asyncio.Event()
        sampler = asyncio.create_task(
            sample_gauges(pools[0], settings.gauge_interval_s, observed.during, stop)
        )
        prober = asyncio.create_task(probe_loop(LOOP_PROBE_INTERVAL_S, observed.loop_lags, stop))
        try:
            yield pools, observed
        finally:
            stop.set()
            await asyncio.gather(sampler, prober)
            observed.after = await scrape(pools[0])
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
    if stopped_early:
        return "cancelled: the replay stopped early"
    return f"not finished within the {settings.drain_timeout_s:g} s drain timeout"


def unfinished(request: Request, sent_s: float | None, why: str) -> RequestResult:
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
    figures["client_lag_max_s"] = result.client_lag_max_s
    figures["client_lag_p99_s"] = result.client_lag_p99_s
    return figures
