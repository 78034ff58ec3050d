"""One replay session: a window's requests sent to a server, and what came of each.

How the requests go out is a ``Sender``'s: at the trace's times (``tuner.load.open_loop``), by a
number of users (``tuner.load.closed_loop``), or from several client processes
(``tuner.load.spread``). The rest is the session's, whichever sends: the HTTP client
(``tuner.load.http``), the window's clock and what is observed around it
(``tuner.load.observe``), the monitor asked every ``ReplaySettings.monitor_interval_s`` whether
to stop, the wait for what is still in flight, and a result for every request: its own, or why
it has none.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx

from tuner.load.event_loop import loop_factory, open_files
from tuner.load.http import Clock, ReplaySettings, make_client, send
from tuner.load.metrics import LiveRequest, ReplayResult, RequestResult
from tuner.load.observe import Lateness, Observed, observing
from tuner.traces.model import Request

T = TypeVar("T")

PREOPEN_MAX = 256
# A wait for a request's time is cut into steps no longer than this, so that a stop is seen
# during long silences too.
WAIT_STEP_S = 1.0
NOT_SENT = "not sent: the replay stopped early"

# Called every ``ReplaySettings.monitor_interval_s`` (1 s: a progress display's tick; the pruner
# keeps its own, slower cadence) with the seconds since the window began and the requests sent so
# far; returning True stops the replay early (the trial is hopeless). It runs on the replay's
# event loop, so it must be quick.
Monitor = Callable[[float, Sequence[LiveRequest]], bool]


class Sender(ABC):
    """How a window's requests go out, for ``replay_async`` to run in a session."""

    @abstractmethod
    async def send(self, session: ReplaySession) -> None:
        """Begin the window (``session.begin``), then send its requests through ``session``
        until every one is sent or ``session.stopped`` is set."""


@dataclass(frozen=True)
class Sent:
    """What one client process sent of a window: each request's result and what was last known
    of it while it ran, by its place in the window; the seconds from the window's start until
    the process's last request ended; whether it was stopped early; how late it ran."""

    results: dict[int, RequestResult]
    live: dict[int, LiveRequest]
    duration_s: float
    stopped: bool
    lateness: Lateness


class ReplaySession:
    """A window replayed from this process: open it with ``opened``, hand it to a ``Sender``,
    ``drain`` it; then ``result`` is what it saw.

    A request is known by its place in the window (``index``). ``live`` holds what is known of
    each one sent while the window runs; ``stopped`` is set once the monitor says stop, and
    ``wake`` with it (a sender may also set ``wake`` for reasons of its own and wait on it).
    """

    def __init__(
        self,
        client: httpx.AsyncClient,
        base_url: str,
        settings: ReplaySettings,
        clock: Clock,
        monitor: Monitor | None,
        read_metrics: bool,
        stack: contextlib.AsyncExitStack,
    ) -> None:
        self.client, self.base_url, self.settings, self.clock = client, base_url, settings, clock
        self.monitor, self.read_metrics, self._stack = monitor, read_metrics, stack
        self.start = clock()
        self.duration_s = 0.0
        self.stopped = asyncio.Event()
        self.wake = asyncio.Event()
        self.live: dict[int, LiveRequest] = {}
        self._requests: dict[int, Request] = {}
        self._tasks: dict[int, asyncio.Task[RequestResult]] = {}
        self._cancelled: set[asyncio.Task[RequestResult]] = set()
        self._gathered: list[Sent] = []
        self._observed: Observed | None = None
        self._watcher: asyncio.Task[None] | None = None

    @classmethod
    @contextlib.asynccontextmanager
    async def opened(
        cls,
        base_url: str,
        settings: ReplaySettings,
        clock: Clock = time.perf_counter,
        monitor: Monitor | None = None,
        read_metrics: bool = True,
    ) -> AsyncIterator[ReplaySession]:
        """A session with its client of the server at ``base_url``; vLLM's ``/metrics`` are read
        around the window unless ``read_metrics`` is False (a client process of a replay spread
        over several). What it observes ends, and the client closes, on leaving."""
        async with make_client(base_url, settings) as client, contextlib.AsyncExitStack() as stack:
            yield cls(client, base_url, settings, clock, monitor, read_metrics, stack)

    async def begin(
        self, at: float | None = None, margin_s: float = 0.0, preopen: Sequence[Request] = ()
    ) -> None:
        """Begin the window: open connections for ``preopen``'s first second, start observing,
        and start the window's clock at ``at`` (an instant of ``clock`` agreed with other client
        processes), else ``margin_s`` from now. The monitor is asked from then on."""
        connections = first_second(preopen)
        await asyncio.gather(
            *(self.client.get("/health") for _ in range(connections)), return_exceptions=True
        )
        gauge_s = self.settings.gauge_interval_s
        self._observed = await self._stack.enter_async_context(
            observing(self.client, gauge_s, self.read_metrics)
        )
        self.start = self.clock() + margin_s if at is None else at
        if self.monitor is not None:
            self._watcher = asyncio.create_task(self._watch(self.monitor))

    def schedule(self, indexed: Sequence[tuple[int, Request]]) -> None:
        """The window's requests known beforehand, by their place in it: those never sent
        come back as not sent."""
        self._requests.update(indexed)

    async def until(self, at_s: float) -> bool:
        """Wait until ``at_s`` seconds into the window; False where the replay stopped first."""
        while (delay := self.start + at_s - self.clock()) > 0 and not self.stopped.is_set():
            await asyncio.sleep(min(delay, WAIT_STEP_S))
        return not self.stopped.is_set()

    def send(
        self, index: int, request: Request, body: bytes, scheduled_s: float
    ) -> asyncio.Task[RequestResult]:
        """Send the window's ``index``-th request (its ``body``), scheduled ``scheduled_s``
        into the window, now; the task that times it."""
        live = self.live[index] = LiveRequest(
            sent_s=scheduled_s,
            scheduled_s=scheduled_s,
            output_tokens=request.output_tokens,
            input_tokens=request.input_tokens,
        )
        self._requests[index] = request
        task = asyncio.create_task(
            send(
                self.client,
                body,
                request,
                scheduled_s,
                self.start,
                self.clock,
                live,
                self.settings.exchange,
            )
        )
        self._tasks[index] = task
        return task

    def stop(self) -> None:
        """Stop the replay early: nothing more is sent, and what is in flight is cancelled."""
        self.stopped.set()
        self.wake.set()

    def gather(self, sent: Sent) -> None:
        """What another client process sent of this window."""
        self._gathered.append(sent)
        self.live.update(sent.live)

    async def drain(self) -> None:
        """Wait for the requests in flight until all are done, ``drain_timeout_s`` passes or a
        stop is asked for; cancel the rest, stop asking the monitor, and end the window."""
        pending = {task for task in self._tasks.values() if not task.done()}
        deadline = self.clock() + self.settings.drain_timeout_s
        while pending and not self.stopped.is_set() and (remaining := deadline - self.clock()) > 0:
            _, pending = await asyncio.wait(pending, timeout=min(remaining, 0.5))
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        self._cancelled = pending
        if self._watcher is not None:
            self._watcher.cancel()
            await asyncio.gather(self._watcher, return_exceptions=True)
        self.duration_s = self.clock() - self.start

    def own(self) -> Sent:
        """What this process sent, once drained and left: a result for every request it sent
        or was given beforehand, in the window's order."""
        assert self._observed is not None, "a session's window never began"
        stopped = self.stopped.is_set()
        if stopped:
            why = "cancelled: the replay stopped early"
        else:
            why = f"not finished within the {self.settings.drain_timeout_s:g} s drain timeout"
        results = {}
        for index in sorted(self._requests):
            request, task = self._requests[index], self._tasks.get(index)
            if task is None:
                results[index] = unfinished(request, None, NOT_SENT)
            elif task in self._cancelled:
                results[index] = unfinished(request, self.live[index].sent_s, why)
            else:
                results[index] = task.result()
        return Sent(results, dict(self.live), self.duration_s, stopped, self._observed.lateness)

    def result(self) -> ReplayResult:
        """What the replay saw, once drained and left: the requests of every client process
        that reported (``gather``), else this one's, with what was observed around the window."""
        assert self._observed is not None, "a session's window never began"
        sent = self._gathered or [self.own()]
        results: dict[int, RequestResult] = {}
        live: dict[int, LiveRequest] = {}
        for part in sent:
            results |= part.results
            live |= part.live
        duration_s = max(part.duration_s for part in sent)
        lateness = Lateness.worst(part.lateness for part in sent)
        observed = self._observed
        return ReplayResult(
            [results[i] for i in sorted(results)],
            duration_s,
            observed.before,
            observed.after,
            observed.during,
            duration_s if any(part.stopped for part in sent) else None,
            [live[i] for i in sorted(live)],
            observed.wall_clock_step_s,
            lateness.lag_max_s,
            lateness.lag_p99_s,
            lateness.cpu,
        )

    async def _watch(self, monitor: Monitor) -> None:
        """Ask ``monitor`` every ``monitor_interval_s`` from the window's start; stop once it
        says so."""
        if (wait_s := self.start - self.clock()) > 0:
            await asyncio.sleep(wait_s)
        while not self.stopped.is_set():
            await asyncio.sleep(self.settings.monitor_interval_s)
            if monitor(self.clock() - self.start, list(self.live.values())):
                self.stop()


async def replay_async(
    base_url: str,
    sender: Sender,
    settings: ReplaySettings,
    clock: Clock = time.perf_counter,
    monitor: Monitor | None = None,
) -> ReplayResult:
    """Replay a window against the server at ``base_url``, its requests sent by ``sender``, and
    wait for all of them to finish. With a ``monitor``, the replay stops early once it says so:
    nothing more is sent and the requests in flight are cancelled."""
    async with ReplaySession.opened(base_url, settings, clock, monitor) as session:
        await sender.send(session)
        await session.drain()
    return session.result()


def first_second(requests: Sequence[Request], most: int = PREOPEN_MAX) -> int:
    """How many connections to open before a window: its first second's requests, at most
    ``most``, so that they do not each wait for a connection of their own."""
    if not requests:
        return 0
    first = min(r.arrival_s for r in requests)
    return min(most, sum(1 for r in requests if r.arrival_s < first + 1.0))


def unfinished(request: Request, sent_s: float | None, why: str) -> RequestResult:
    """A request that never finished, as a failed result saying ``why``."""
    return RequestResult(
        request.arrival_s,
        request.arrival_s if sent_s is None else sent_s,
        request.input_tokens,
        request.output_tokens,
        error=why,
    )


def run(main: Coroutine[Any, Any, T]) -> T:
    """Run a replay on its own event loop: uvloop's where it is installed (it comes with vLLM;
    its loop cost a replay about a quarter less CPU than asyncio's), else asyncio's. The
    process may first open as many files as ``open_files`` allows: a connection is one.

    Ctrl-C cancels the replay and raises ``KeyboardInterrupt`` (``asyncio.Runner``'s own
    handling); so does SIGTERM where the process handles it (``tuner``'s command line does): a
    Python handler that raises runs wherever the signal lands, and inside a callback of uvloop's
    (a stream read) uvloop logs the exception, drops that one connection and goes on.
    """
    open_files()
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        try:
            return runner.run(_stopped_by_sigterm(main))
        except _Terminated:
            raise KeyboardInterrupt from None


class _Terminated(Exception):
    """SIGTERM arrived while a replay ran."""


async def _stopped_by_sigterm(main: Coroutine[Any, Any, T]) -> T:
    """``main``, cancelled by the loop itself when SIGTERM arrives, where the process has a
    handler of its own for it (else SIGTERM ends the process, as it would have); the handler
    is given back after."""
    previous = signal.getsignal(signal.SIGTERM)
    if not callable(previous) or threading.current_thread() is not threading.main_thread():
        return await main
    task = asyncio.current_task()
    assert task is not None
    terminated = False

    def terminate() -> None:
        nonlocal terminated
        terminated = True
        task.cancel()

    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, terminate)
    try:
        result = await main
    except asyncio.CancelledError:
        if terminated:
            raise _Terminated from None
        raise
    finally:
        loop.remove_signal_handler(signal.SIGTERM)
        signal.signal(signal.SIGTERM, previous)
    if terminated:  # a replay that took the cancellation as a stop, and returned
        raise _Terminated
    return result
