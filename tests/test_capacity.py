"""The capacity search: the rate search alone, the window at a rate, the lost-SLO rule, and the
whole measurement against a stand-in server whose capacity is known (in-process, seconds).

The stand-in serves ``SLOTS`` requests at a time, each for ``SERVICE_S`` before its first token,
in arrival order: it carries ``SLOTS / SERVICE_S`` requests a second, and above that rate its
queue, and with it TTFT, grows for as long as the window lasts.
"""

from __future__ import annotations

import asyncio
import json
import math
import threading
from collections.abc import Iterator

import pytest

from tuner.load.http import ReplaySettings
from tuner.load.metrics import LiveRequest
from tuner.study.capacity import CapacitySettings, lost_slos, measure_capacity
from tuner.study.rates import RatePoint, search_capacity
from tuner.traces.model import Request
from tuner.traces.workload import at_rate

SLOTS = 2
SERVICE_S = 0.2
CAPACITY_REQ_PER_S = SLOTS / SERVICE_S


# --- the rate search alone --------------------------------------------------------------


def threshold(true_req_per_s: float, calls: list[float]):
    def measure(rate: float) -> RatePoint:
        calls.append(rate)
        return RatePoint(rate, rate <= true_req_per_s)

    return measure


@pytest.mark.parametrize("true_req_per_s", [0.37, 1.0, 3.3, 9.9, 41.0])
@pytest.mark.parametrize("resolution", [0.05, 0.1, 0.25])
def test_the_search_lands_within_the_resolution(true_req_per_s, resolution):
    calls: list[float] = []
    found = search_capacity(threshold(true_req_per_s, calls), 3.0, resolution, max_windows=20)
    assert found.resolved
    assert found.capacity_req_per_s <= true_req_per_s
    assert found.capacity_req_per_s * (1 + resolution) >= true_req_per_s
    assert len(found.points) == len(calls)
    assert [p.rate_req_per_s for p in found.points] == calls
    # The bracket takes one window per doubling or halving from the start, the bisection
    # log2(log 2 / log(1 + resolution)) rounded up.
    bracket = 2 + math.floor(abs(math.log2(true_req_per_s / 3.0)))
    bisect = math.ceil(math.log2(math.log(2) / math.log(1 + resolution)))
    assert len(calls) <= bracket + bisect


def test_the_search_stops_at_its_window_limit_and_floor():
    calls: list[float] = []
    found = search_capacity(threshold(100.0, calls), 1.0, 0.1, max_windows=4)
    assert not found.resolved and len(calls) == 4
    assert found.capacity_req_per_s == 8.0  # 1, 2, 4, 8 passed
    assert "window limit" in found.why_stopped

    calls = []
    found = search_capacity(threshold(0.01, calls), 1.0, 0.1, floor_req_per_s=0.2)
    assert found.capacity_req_per_s == 0.0 and not found.resolved
    assert calls == [1.0, 0.5, 0.25]
    assert "floor" in found.why_stopped


# --- the window at a rate ----------------------------------------------------------------


def test_a_window_at_a_rate_keeps_its_shape_and_repeats():
    window = [Request(0.0, 10, 2), Request(0.5, 20, 3), Request(0.6, 30, 4), Request(1.5, 40, 5)]
    # 4 requests over a 2 s period: 2 req/s; at 4 req/s the arrivals are halved.
    sent = at_rate(window, 2.0, 4.0, 3.0)
    assert [r.arrival_s for r in sent[:4]] == [0.0, 0.25, 0.3, 0.75]
    assert [r.arrival_s for r in sent[4:]] == [1.0, 1.25, 1.3, 1.75, 2.0, 2.25, 2.3, 2.75]
    assert [r.input_tokens for r in sent] == [10, 20, 30, 40] * 3
    assert len(sent) / 3.0 == 4.0
    slow = at_rate(window, 2.0, 0.5, 10.0)  # a quarter of the rate: 4x slower
    assert [r.arrival_s for r in slow] == [0.0, 2.0, 2.4, 6.0, 8.0]


# --- the lost-SLO rule -------------------------------------------------------------------


def test_a_window_is_lost_only_when_the_percentile_cannot_recover():
    slos = {"ttft_p95_s": 1.0, "e2e_p99_s": 5.0, "tpot_p95_s": 0.1}
    # 100 requests in the window: p95 is past 1 s once 100 - floor(0.95 * 99) = 6 are.
    late = [LiveRequest(sent_s=0.0) for _ in range(5)]  # waiting 2 s at now = 2
    fast = [LiveRequest(sent_s=0.0, first_token_s=0.1, done_s=0.5) for _ in range(20)]
    assert lost_slos(2.0, late + fast, 100, slos) == []
    late.append(LiveRequest(sent_s=0.5, first_token_s=1.6, done_s=2.0))
    assert lost_slos(2.0, late + fast, 100, slos) == ["ttft_p95_s"]
    # Then the end-to-end p99: 100 - floor(0.99 * 99) = 3 requests past 5 s, still waiting.
    assert lost_slos(6.0, late + fast, 100, slos) == ["ttft_p95_s", "e2e_p99_s"]


# --- against a stand-in server -----------------------------------------------------------


def _chunk(payload: bytes) -> bytes:
    line = b"data: " + payload + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(line), line)


class StandIn:
    """``SLOTS`` requests at a time, ``SERVICE_S`` each before the first token, FIFO."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.port = 0
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        self.ready.wait(10)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.slots = asyncio.Semaphore(SLOTS)
        server = self.loop.run_until_complete(
            asyncio.start_server(self._handle, "127.0.0.1", 0, backlog=1024)
        )
        self.port = server.sockets[0].getsockname()[1]
        self.ready.set()
        self.loop.run_forever()
        server.close()
        pending = asyncio.all_tasks(self.loop)
        for task in pending:
            task.cancel()
        self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        self.loop.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                method, path, _ = head.split(b"\r\n", 1)[0].split(b" ", 2)
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                body = await reader.readexactly(length) if length else b""
                if method == b"POST" and path == b"/v1/completions":
                    tokens = json.loads(body)["max_tokens"]
                    async with self.slots:
                        await asyncio.sleep(SERVICE_S)
                    out = [b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"]
                    out.append(b"transfer-encoding: chunked\r\n\r\n")
                    for i in range(tokens):
                        out.append(_chunk(b'{"choices":[{"index":0,"text":" t%d"}]}' % i))
                    usage = b'{"choices":[],"usage":{"completion_tokens":%d}}' % tokens
                    out += [_chunk(usage), _chunk(b"[DONE]"), b"0\r\n\r\n"]
                    writer.write(b"".join(out))
                elif path == b"/metrics":
                    writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                else:
                    writer.write(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture
def stand_in() -> Iterator[StandIn]:
    server = StandIn()
    try:
        yield server
    finally:
        server.close()


def test_the_search_finds_a_known_capacity(stand_in, caplog):
    # Evenly spaced arrivals: below the capacity nothing queues, above it the queue grows by
    # (rate - capacity) requests a second. With a TTFT SLO 0.1 s above the service time, a
    # 4 s window at rate r misses once (r / capacity - 1) * 4 s * 0.95 > 0.1 s: near 1.03x.
    window = [Request(i * 0.2, 8, 2) for i in range(5)]  # 5 req/s
    settings = CapacitySettings(window, period_s=1.0, window_s=4.0, resolution=0.1, max_windows=8)
    replay = ReplaySettings(model="m", vocab_size=1000, request_timeout_s=30, drain_timeout_s=30)
    slos = {"ttft_p95_s": SERVICE_S + 0.1}
    with caplog.at_level("INFO", logger="tuner.study.rates"):
        found = measure_capacity(stand_in.url, settings, replay, slos, {"ttft_p95_s": 1.0})
    rates = [round(p.rate_req_per_s, 2) for p in found.points]
    assert found.resolved, (rates, found.why_stopped)
    assert CAPACITY_REQ_PER_S / 1.1 <= found.capacity_req_per_s <= CAPACITY_REQ_PER_S * 1.05, rates
    assert len(found.points) <= settings.max_windows
    assert len([r for r in caplog.records if "req/s:" in r.getMessage()]) == len(found.points)
    best = found.best_point
    assert best is not None and best.figures["ttft_p95_s"] <= slos["ttft_p95_s"]
    # Far above the capacity, a window stops within seconds: its SLO is lost for certain.
    stopped = [p for p in found.points if p.figures.get("stopped_at_s") is not None]
    assert all(not p.passed and "lost" in (p.reason or "") for p in stopped)
    assert all(p.figures["prefix_cache_reset"] == 0.0 for p in found.points)  # a 404 here
