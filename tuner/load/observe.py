"""What is observed around a replayed window: vLLM's ``/metrics`` and tuner's own client.

vLLM's ``/metrics`` is read before the window, sampled during it (for the gauges) and read after
it; tuner's own event loop is probed for lateness throughout, its CPU counted, and the system's
wall clock checked against the monotonic one. For the window's length the garbage collector is
tuned so that it does not hold the loop up.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field

import httpx

logger = logging.getLogger(__name__)

# A wall clock that moved more than this against the monotonic one over a window is reported
# (a slewing NTP daemon moves it by at most 0.5 ms a second).
WALL_CLOCK_TOLERANCE_S = 0.05

# tuner's own event loop is probed this often during a window: how late a timer fires is how late
# tuner reads what the server sent. Above the warning level, tuner's latencies include its own
# slowness (a client short of CPU), not only the server's.
LOOP_PROBE_INTERVAL_S = 0.01
LOOP_LAG_WARNING_S = 0.1
GC_THRESHOLDS = (100_000, 50, 1000)


@dataclass(frozen=True)
class Lateness:
    """How late tuner's client processes ran over a window: the worst timer lateness of their
    event loops and its 99th percentile (tuner's latencies include up to this much of its own
    delay), and the CPU each spent, in cores (CPU seconds per second)."""

    lag_max_s: float = 0.0
    lag_p99_s: float = 0.0
    cpu: tuple[float, ...] = ()

    @classmethod
    def worst(cls, processes: Iterable[Lateness]) -> Lateness:
        """Several processes' lateness as one: the worst of each lag, every process's CPU."""
        parts = list(processes)
        return cls(
            max((p.lag_max_s for p in parts), default=0.0),
            max((p.lag_p99_s for p in parts), default=0.0),
            tuple(cpu for p in parts for cpu in p.cpu),
        )


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
    """vLLM's ``/metrics`` around a window (before, sampled during, after; empty where this
    process does not read them), how far the wall clock moved, and this process's lateness."""

    before: str = ""
    during: list[str] = field(default_factory=list)
    after: str = ""
    wall_offset_before_s: float = field(default_factory=lambda: time.time() - time.monotonic())
    wall_offset_after_s: float | None = None
    loop_lags: list[float] = field(default_factory=list)
    cpu: float = 0.0

    @property
    def wall_clock_step_s(self) -> float:
        """How far the system's wall clock moved against the monotonic one over the window.
        vLLM times requests with the wall clock (``time.time()``), tuner with the monotonic one;
        a clock set during the window (NTP stepping a freshly booted machine) shifts vLLM's
        figures, not tuner's."""
        if self.wall_offset_after_s is None:
            return 0.0
        return self.wall_offset_after_s - self.wall_offset_before_s

    @property
    def lateness(self) -> Lateness:
        """This process's lateness over the window."""
        lags = sorted(self.loop_lags) or [0.0]
        p99 = lags[min(len(lags) - 1, int(0.99 * len(lags)))]
        return Lateness(lags[-1], p99, (self.cpu,))


@contextlib.asynccontextmanager
async def observing(
    client: httpx.AsyncClient, gauge_interval_s: float, read_metrics: bool = True
) -> AsyncIterator[Observed]:
    """Observe what runs inside: vLLM's ``/metrics`` through ``client`` (unless
    ``read_metrics`` is False: a client process of a replay spread over several), tuner's own
    loop probed and its CPU counted; warnings logged where the wall clock moved or the loop ran
    late.

    For the window's length, the objects that exist before it are frozen out of the garbage
    collector's scans and its young generation is collected less often: collections held the
    loop up to 0.1 s at 300 req/s (a replay leaves about 40 objects in cycles a request, so the
    collector cannot simply be turned off for a long window).
    """
    observed = Observed(before=await scrape(client) if read_metrics else "")
    if read_metrics and "vllm:" not in observed.before:
        logger.warning(
            "the server shows no vLLM metrics at /metrics: this window is scored on tuner's "
            "client figures alone"
        )
    stop = asyncio.Event()
    sampler = None
    if read_metrics:
        sampler = asyncio.create_task(
            sample_gauges(client, gauge_interval_s, observed.during, stop)
        )
    prober = asyncio.create_task(probe_loop(LOOP_PROBE_INTERVAL_S, observed.loop_lags, stop))
    gc.collect()
    gc.freeze()
    thresholds = gc.get_threshold()
    gc.set_threshold(*GC_THRESHOLDS)
    cpu_before_s, wall_before_s = time.process_time(), time.perf_counter()
    try:
        yield observed
    finally:
        wall_s = time.perf_counter() - wall_before_s
        observed.cpu = (time.process_time() - cpu_before_s) / max(wall_s, 1e-9)
        gc.set_threshold(*thresholds)
        gc.unfreeze()
        stop.set()
        await asyncio.gather(prober, *([sampler] if sampler else []))
        if read_metrics:
            observed.after = await scrape(client)
        observed.wall_offset_after_s = time.time() - time.monotonic()
        _warn(observed)


def _warn(observed: Observed) -> None:
    """Say where the window's figures are off: the wall clock moved, or tuner's loop ran late."""
    if abs(observed.wall_clock_step_s) > WALL_CLOCK_TOLERANCE_S:
        logger.warning(
            "the system clock moved %+.3f s against the monotonic clock during the "
            "window: vLLM's own latency figures are off by up to that much",
            observed.wall_clock_step_s,
        )
    if (lag_s := observed.lateness.lag_max_s) > LOOP_LAG_WARNING_S:
        logger.warning(
            "tuner's own event loop ran up to %.3f s late during the window: its "
            "latencies include that much of its own delay (is the machine short of CPU?)",
            lag_s,
        )
