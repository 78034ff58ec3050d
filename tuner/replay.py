"""Open-loop replay of a trace against an OpenAI-compatible ``/v1/completions`` endpoint.

The only asynchronous code in tuner. Each request is sent at its trace time, whatever the server
is doing, and streamed so that the time to the first token is seen. vLLM's ``/metrics`` is read
before, during (for the gauges) and after the window.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace

import httpx

from tuner.concurrency import ConcurrencyTrace
from tuner.metrics import LiveRequest, RequestResult
from tuner.prompts import prompt_token_ids
from tuner.trace import Request

logger = logging.getLogger(__name__)

Clock = Callable[[], float]

# Connection pools a replay spreads its requests over. httpcore (1.0.9) scans every connection
# of a pool, and for idle ones every connection again, each time a request starts or ends; with
# hundreds of streams in flight that bookkeeping starved the send loop (2 s streams at 200 req/s
# on two cores: send lag p99 6.5 s with one pool, 57 ms with 16; benchmarks/replay_fidelity.py
# --hold-s 2).
POOLS = 16

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


@dataclass(frozen=True)
class ReplaySettings:
    """How to talk to the server: which model, how long to wait, how often to read gauges."""

    model: str
    vocab_size: int
    block_tokens: int = 0
    seed: int = 0
    request_timeout_s: float = 600.0
    drain_timeout_s: float = 600.0
    gauge_interval_s: float = 1.0
    monitor_interval_s: float = 1.0


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


def request_body(index: int, request: Request, settings: ReplaySettings) -> bytes:
    """The JSON body of one streamed completion with forced output length."""
    body = {
        "model": settings.model,
        "prompt": prompt_token_ids(
            index, request, settings.vocab_size, settings.block_tokens, settings.seed
        ),
        "max_tokens": request.output_tokens,
        "min_tokens": request.output_tokens,
        "ignore_eos": True,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    return json.dumps(body, separators=(",", ":")).encode()


async def _send(
    client: httpx.AsyncClient,
    body: bytes,
    request: Request,
    scheduled_s: float,
    start: float,
    clock: Clock,
    live: LiveRequest | None = None,
) -> RequestResult:
    sent = clock()
    if live is not None:
        live.sent_s = sent - start
    ttft_s: float | None = None
    tokens = 0
    usage_tokens: int | None = None
    try:
        async with client.stream(
            "POST",
            "/v1/completions",
            content=body,
            headers={"content-type": "application/json"},
        ) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")[:300]
                return RequestResult(
                    scheduled_s,
                    sent - start,
                    request.input_tokens,
                    request.output_tokens,
                    error=f"HTTP {response.status_code}: {text}",
                )
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    # Read on to the end of the body: a connection closed mid-body cannot
                    # be reused, and a new one per request costs the replay loop dearly.
                    continue
                chunk = json.loads(data)
                if chunk.get("choices"):
                    if ttft_s is None:
                        ttft_s = clock() - sent
                        if live is not None:
                            live.first_token_s = ttft_s + live.sent_s
                    tokens += 1
                if chunk.get("usage"):
                    usage_tokens = chunk["usage"].get("completion_tokens")
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        return RequestResult(
            scheduled_s,
            sent - start,
            request.input_tokens,
            request.output_tokens,
            ttft_s=ttft_s,
            tokens_received=tokens,
            error=f"{type(exc).__name__}: {exc}"[:300],
        )
    e2e_s = clock() - sent
    if live is not None:
        live.done_s = e2e_s + live.sent_s
    received = usage_tokens if usage_tokens is not None else tokens
    error = None
    if received != request.output_tokens:
        error = f"short output: {received} of {request.output_tokens} tokens"
    return RequestResult(
        scheduled_s,
        sent - start,
        request.input_tokens,
        request.output_tokens,
        ttft_s=ttft_s,
        e2e_s=e2e_s,
        tokens_received=received,
        error=error,
    )


async def _scrape(client: httpx.AsyncClient) -> str:
    try:
        response = await client.get("/metrics", timeout=10.0)
    except httpx.HTTPError as exc:
        logger.warning("reading /metrics failed: %s", exc)
        return ""
    return response.text if response.status_code == 200 else ""


async def _probe_loop(interval_s: float, into: list[float], stop: asyncio.Event) -> None:
    """Append how late each ``interval_s`` timer fires until ``stop`` is set."""
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        due = loop.time() + interval_s
        await asyncio.sleep(interval_s)
        into.append(max(0.0, loop.time() - due))


async def _sample_gauges(
    client: httpx.AsyncClient, interval_s: float, into: list[str], stop: asyncio.Event
) -> None:
    while not stop.is_set():
        into.append(await _scrape(client))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=interval_s)


@dataclass
class _Observed:
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
async def _clients(
    base_url: str, settings: ReplaySettings
) -> AsyncIterator[tuple[list[httpx.AsyncClient], _Observed]]:
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
        observed = _Observed(before=await _scrape(pools[0]))
        stop = asyncio.Event()
        sampler = asyncio.create_task(
            _sample_gauges(pools[0], settings.gauge_interval_s, observed.during, stop)
        )
        prober = asyncio.create_task(_probe_loop(LOOP_PROBE_INTERVAL_S, observed.loop_lags, stop))
        try:
            yield pools, observed
        finally:
            stop.set()
            await asyncio.gather(sampler, prober)
            observed.after = await _scrape(pools[0])
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


async def _watch(
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


async def _drain(
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


def _why_unfinished(stopped_early: bool, settings: ReplaySettings) -> str:
    if stopped_early:
        return "cancelled: the replay stopped early"
    return f"not finished within the {settings.drain_timeout_s:g} s drain timeout"


def _unfinished(request: Request, sent_s: float | None, why: str) -> RequestResult:
    return RequestResult(
        request.arrival_s,
        request.arrival_s if sent_s is None else sent_s,
        request.input_tokens,
        request.output_tokens,
        error=why,
    )


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
    bodies = [request_body(i, r, settings) for i, r in enumerate(requests)]
    async with _clients(base_url, settings) as (pools, observed):
        stopped = asyncio.Event()
        live: list[LiveRequest] = []
        tasks: list[asyncio.Task[RequestResult]] = []
        start = clock()
        watcher = None
        if monitor is not None:
            watcher = asyncio.create_task(
                _watch(monitor, live, start, clock, settings.monitor_interval_s, stopped)
            )
        for request, body in zip(requests, bodies, strict=True):
            # Sleep in short steps so that a stop is seen during long silences too.
            while (delay := start + request.arrival_s - clock()) > 0 and not stopped.is_set():
                await asyncio.sleep(min(delay, 1.0))
            if stopped.is_set():
                break
            live.append(LiveRequest(sent_s=request.arrival_s))
            tasks.append(
                asyncio.create_task(
                    _send(
                        pools[len(tasks) % POOLS],
                        body,
                        request,
                        request.arrival_s,
                        start,
                        clock,
                        live[-1],
                    )
                )
            )
        pending = await _drain(tasks, stopped, settings.drain_timeout_s, clock, watcher)
        duration_s = clock() - start
        stopped_at_s = duration_s if stopped.is_set() else None
    why = _why_unfinished(stopped_at_s is not None, settings)
    results = []
    for i, request in enumerate(requests):
        if i >= len(tasks):
            results.append(_unfinished(request, None, "not sent: the replay stopped early"))
        elif tasks[i] in pending:
            results.append(_unfinished(request, live[i].sent_s, why))
        else:
            results.append(tasks[i].result())
    return observed.result(results, duration_s, stopped_at_s, live)


def replay(
    base_url: str,
    requests: Sequence[Request],
    settings: ReplaySettings,
    clock: Clock = time.perf_counter,
    monitor: Monitor | None = None,
) -> ReplayResult:
    """Blocking wrapper around ``replay_async``."""
    return asyncio.run(replay_async(base_url, requests, settings, clock, monitor))


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
    async with _clients(base_url, settings) as (pools, observed):
        loop = asyncio.get_running_loop()
        wake = asyncio.Event()
        stopped = asyncio.Event()
        in_flight: set[asyncio.Task[RequestResult]] = set()
        cooling = 0
        sent: list[tuple[Request, asyncio.Task[RequestResult]]] = []
        live: list[LiveRequest] = []

        def cooled() -> None:
            nonlocal cooling
            cooling -= 1
            wake.set()

        def finished(task: asyncio.Task[RequestResult]) -> None:
            nonlocal cooling
            in_flight.discard(task)
            if not task.cancelled() and task.exception() is None and task.result().error:
                cooling += 1
                loop.call_later(error_backoff_s, cooled)
            else:
                wake.set()

        start = clock()
        watcher = None
        if monitor is not None:
            watcher = asyncio.create_task(
                _watch(monitor, live, start, clock, settings.monitor_interval_s, stopped, wake)
            )
        while (now := clock() - start) < schedule.end_s and not stopped.is_set():
            while len(in_flight) + cooling < schedule.target_at(now):
                request = replace(next(requests), arrival_s=now)
                body = request_body(len(sent), request, settings)
                live.append(LiveRequest(sent_s=now))
                # One pool: in flight here is at most the schedule's target, and a connection
                # opened per pool would count its set-up as time in flight.
                task = asyncio.create_task(
                    _send(pools[0], body, request, now, start, clock, live[-1])
                )
                task.add_done_callback(finished)
                in_flight.add(task)
                sent.append((request, task))
            wake.clear()
            wait_s = schedule.next_change_s(now) - (clock() - start)
            if wait_s > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wake.wait(), timeout=wait_s)
        tasks = [task for _, task in sent]
        pending = await _drain(tasks, stopped, settings.drain_timeout_s, clock, watcher)
        duration_s = clock() - start
        stopped_at_s = duration_s if stopped.is_set() else None
    why = _why_unfinished(stopped_at_s is not None, settings)
    results = [
        task.result() if task not in pending else _unfinished(request, request.arrival_s, why)
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
    return asyncio.run(
        replay_closed_loop_async(base_url, schedule, requests, settings, clock, monitor=monitor)
    )
