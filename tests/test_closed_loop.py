"""Concurrency traces: loading, length sources, and closed-loop replay against real servers.

The fast tests use a throw-away OpenAI-like HTTP server (a thread, real sockets) that streams
one token every few milliseconds and records how many requests it holds at once. The
``vllm`` test replays against the CPU build of vLLM.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest
from conftest import CPU_ENGINE_ARGS

from tuner.engine.process import Engine
from tuner.errors import InputError, TraceError
from tuner.load.closed_loop import replay_closed_loop
from tuner.load.http import ReplaySettings
from tuner.load.metrics import measured_in_flight
from tuner.load.open_loop import replay_in_process
from tuner.traces.concurrency import (
    LengthSource,
    busiest_window_start,
    closed_loop_requests,
    draw_distribution,
    from_samples,
    load_concurrency,
)
from tuner.traces.formats import load_trace
from tuner.traces.model import Request
from tuner.traces.profile import in_flight, time_weighted

TOKEN_S = 0.01


class CountingServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.lock = threading.Lock()
        self.active = 0
        self.samples: list[tuple[float, int]] = []  # (monotonic time, active after change)
        self.fail = False
        self.on_request: Callable[[], None] | None = None

    def handle_error(self, request: object, client_address: object) -> None:
        """A client that hung up mid-stream (a stopped replay cancels its requests) is normal."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)  # type: ignore[arg-type]

    def change(self, delta: int) -> None:
        with self.lock:
            self.active += delta
            self.samples.append((time.monotonic(), self.active))


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: CountingServer

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        if self.server.on_request is not None:
            self.server.on_request()
        if self.server.fail:
            self.send_response(503)
            self.send_header("content-length", "4")
            self.end_headers()
            self.wfile.write(b"busy")
            return
        self.server.change(+1)
        try:
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            for _ in range(body["max_tokens"]):
                time.sleep(TOKEN_S)
                self._chunk(b'data: {"choices":[{"text":"x"}]}\n\n')
            self._chunk(
                b'data: {"choices":[],"usage":{"completion_tokens":%d}}\n\n' % body["max_tokens"]
            )
            self._chunk(b"data: [DONE]\n\n")
            self._chunk(b"")
        finally:
            self.server.change(-1)

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()


@pytest.fixture
def server():
    httpd = CountingServer()
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def settings(**kw) -> ReplaySettings:
    return ReplaySettings(model="m", vocab_size=100, gauge_interval_s=10.0, **kw)


def test_load_concurrency_trace(write_trace, caplog):
    schedule = load_concurrency(write_trace("timestamp,concurrency\n10,2\n12,5.4\n11,0\n"))
    assert "out of time order" in caplog.text
    assert schedule.time_s.tolist() == [0.0, 1.0, 2.0]
    assert schedule.concurrency.tolist() == [2, 0, 5]
    assert schedule.end_s == 3.0  # the last sample holds one median interval
    assert [schedule.target_at(t) for t in (0, 0.5, 1.0, 2.5, 3.0)] == [2, 2, 0, 5, 0]
    assert schedule.next_change_s(0.2) == 1.0 and schedule.next_change_s(2.5) == 3.0


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        ("timestamp,concurrency\n0,1\n1,-1\n", 3, "between 0"),
        ("timestamp,concurrency\n0,1\n0,2\n", 3, "same timestamp"),
        ("timestamp,concurrency\n0,1\n1,x\n", 3, "number"),
        ("timestamp,concurrency\n0,1\n1,inf\n", 3, "between 0"),
    ],
)
def test_bad_concurrency_rows(write_trace, text, line, words):
    with pytest.raises(TraceError) as caught:
        load_concurrency(write_trace(text))
    assert caught.value.line == line and words in str(caught.value)


def test_all_zero_concurrency_is_refused(write_trace):
    with pytest.raises(TraceError, match="0 throughout"):
        load_concurrency(write_trace("timestamp,concurrency\n0,0\n1,0\n"))


def test_lengths_are_seeded_and_keep_pairs(write_trace):
    trace = load_trace(
        write_trace("timestamp,input_tokens,output_tokens\n0,10,1\n1,20,2\n2,30,3\n")
    )
    source = LengthSource.from_trace(trace)
    stream = closed_loop_requests(source, seed=4)
    first = [next(stream) for _ in range(3000)]  # across the stream's chunks
    again = closed_loop_requests(source, seed=4)
    assert [next(again) for _ in range(3000)] == first
    assert {(r.input_tokens, r.output_tokens) for r in first} == {(10, 1), (20, 2), (30, 3)}
    other = closed_loop_requests(source, seed=5)
    assert [next(other) for _ in range(3000)] != first
    clipped = next(closed_loop_requests(LengthSource(np.array([5000]), np.array([9000])), 0, 4096))
    assert (clipped.input_tokens, clipped.output_tokens) == (1, 4095)


def test_length_distributions():
    rng = np.random.default_rng(0)
    assert set(draw_distribution("fixed:7", 10, rng)) == {7}
    uniform = draw_distribution("uniform:5:9", 5000, rng)
    assert uniform.min() == 5 and uniform.max() == 9
    lognormal = draw_distribution("lognormal:200:0.5", 20000, rng)
    assert np.median(lognormal) == pytest.approx(200, rel=0.05)
    for bad in ("gamma:1", "fixed:0", "uniform:9:5", "lognormal:x:1", "fixed:1:2"):
        with pytest.raises(InputError):
            draw_distribution(bad, 1, rng)


def request_overhead_s(url: str) -> float:
    """What one request costs here beyond its tokens (tuner's client and this server share a
    process): one-token requests one after another for 1 s. On 2 cores busy with other work
    (load average 6) it measured 19 to 22 ms, and 28 to 32 ms with two busy processes added."""
    one_token = closed_loop_requests(LengthSource(np.array([4]), np.array([1])))
    result = replay_closed_loop(url, from_samples([0.0, 0.5], [1, 1]), one_token, settings())
    return result.duration_s / len(result.results) - TOKEN_S


@pytest.mark.vllm  # a stand-in server's windows, waited out in real time
def test_closed_loop_follows_the_target(server):
    """2 in flight, then 6, then 1, for 5 requests' time each. A request lasts 0.2 s (20 tokens)
    or 20 times what a request costs beyond its tokens, where that is longer, and every time
    below scales with it: the gap between one request's end and its successor's send, and the
    ramp to 6, stay as small a share of each phase on any machine."""
    url = f"http://127.0.0.1:{server.server_port}"
    tokens = max(20, round(20 * request_overhead_s(url) / TOKEN_S))
    scale = tokens / 20  # 1 s a phase at 1
    del server.samples[:]
    schedule = from_samples([0.0, scale, 2 * scale], [2, 6, 1])
    lengths = LengthSource(np.array([4]), np.array([tokens]))
    result = replay_closed_loop(url, schedule, closed_loop_requests(lengths), settings())
    assert all(r.ok for r in result.results), result.results[0].error
    # Client side: requests in flight, from send to end, in each phase.
    sent = np.array([r.sent_s for r in result.results])
    done = sent + np.array([r.e2e_s for r in result.results])
    times_s, counts = in_flight(sent, done)
    # Requests that end together are replaced a moment later, so time-weighted means, from lo
    # on (the count at lo is the one carried in from the last change before it).
    for lo, hi, want in ((0.1, 0.9, 2), (1.3, 1.9, 6), (2.3, 2.9, 1)):
        lo, hi = lo * scale, hi * scale
        inside = (times_s > lo) & (times_s < hi)
        at_lo = counts[times_s <= lo][-1]
        window_s = np.concatenate(([lo], times_s[inside]))
        window_counts = np.concatenate(([at_lo], counts[inside]))
        assert time_weighted(window_s, window_counts, hi)["mean"] == pytest.approx(want, abs=0.3), (
            lo,
            window_counts,
        )
    # Every decision to send fills the target and never passes it. Counted when the loop
    # decided (``scheduled_s``; the request goes out a moment later, maybe after the target
    # fell), and not as a peak: when the target falls, requests sent before it may still be
    # finishing, late on a busy machine.
    decided = np.array([r.scheduled_s for r in result.results])
    at_send = np.array([np.count_nonzero((decided <= s) & (done > s)) for s in decided])
    targets = np.array([schedule.target_at(s) for s in decided])
    over = [(s, n, t) for s, n, t in zip(decided, at_send, targets, strict=True) if n > t]
    assert not over, over
    for lo, hi, want in ((0.0, 1.0, 2), (1.0, 2.0, 6), (2.0, 3.0, 1)):
        assert at_send[(decided >= lo * scale) & (decided < hi * scale)].max() == want
    # Server side: what it actually held, time-weighted over each phase, on a clock that
    # starts when the first request reached it.
    began = server.samples[0][0]
    stamps = np.array([t - began for t, _ in server.samples])
    active = np.array([a for _, a in server.samples], dtype=float)
    for lo, hi, want in ((0.2, 0.9, 2), (1.3, 1.9, 6), (2.3, 2.9, 1)):
        lo, hi = lo * scale, hi * scale
        inside = (stamps >= lo) & (stamps < hi)
        stats = time_weighted(stamps[inside], active[inside], hi)
        assert stats["mean"] == pytest.approx(want, abs=0.6), (lo, stats)
    # What inspect reports of a replay: the time-mean of (2, 6, 1) over a phase each, less the
    # gaps between one request and its successor.
    measured = measured_in_flight(result.results)
    assert measured["max"] == 6 and measured["mean"] == pytest.approx(3.0, abs=0.5)
    # Sending stopped at the end of the schedule (three phases), the last ones drained.
    assert sent.max() < schedule.end_s
    # Little's law: (2 + 6 + 1) phases' slot-seconds over the mean latency, give or take the
    # gaps between one request's end and its successor's send.
    mean_e2e_s = float(np.mean([r.e2e_s for r in result.results]))
    assert len(result.results) == pytest.approx(9 * scale / mean_e2e_s, rel=0.2)


def test_closed_loop_backs_off_on_errors(server):
    server.fail = True
    schedule = from_samples([0.0, 1.0], [3, 3])  # 2 s
    result = replay_closed_loop(
        f"http://127.0.0.1:{server.server_port}",
        schedule,
        closed_loop_requests(LengthSource(np.array([4]), np.array([2]))),
        settings(),
    )
    assert result.results and all("HTTP 503" in (r.error or "") for r in result.results)
    # 3 slots, each retried at most every 0.1 s for 2 s: about 60, far from a flood.
    assert len(result.results) <= 3 * (2.0 / 0.1 + 1)


def test_closed_loop_stops_when_the_monitor_says_so(server):
    """A hopeless trial costs seconds: nothing more is sent, what is in flight is cancelled."""
    schedule = from_samples([0.0, 10.0], [3, 3])  # 10 s of 3 in flight
    lengths = LengthSource(np.array([4]), np.array([100]))  # 1 s a request
    seen: list[tuple[float, int]] = []

    def monitor(elapsed_s, live):
        seen.append((elapsed_s, len(live)))
        return elapsed_s > 1.5

    result = replay_closed_loop(
        f"http://127.0.0.1:{server.server_port}",
        schedule,
        closed_loop_requests(lengths),
        settings(monitor_interval_s=0.25),
        monitor=monitor,
    )
    assert result.stopped_at_s is not None and 1.5 < result.stopped_at_s < 3.0
    assert result.duration_s < 3.0
    # The monitor saw every request sent so far, live.
    assert seen[-1][1] == len(result.live) == len(result.results) >= 3
    cancelled = [r for r in result.results if not r.ok]
    assert len(cancelled) == 3  # the three in flight at the stop
    assert all(r.error == "cancelled: the replay stopped early" for r in cancelled)
    assert all(r.ok for r in result.results if r not in cancelled)
    pairs = zip(result.live, result.results, strict=True)
    assert all(live.done_s is not None for live, r in pairs if r.ok)


def test_open_loop_stops_when_the_monitor_says_so(server):
    """Finished requests keep their results; in flight ones are cancelled, later ones unsent."""
    requests = [Request(0.25 * i, 4, 50) for i in range(20)]  # 5 s of arrivals, 0.5 s each
    result = replay_in_process(
        f"http://127.0.0.1:{server.server_port}",
        requests,
        settings(monitor_interval_s=0.25),
        monitor=lambda elapsed_s, live: elapsed_s > 1.5,
    )
    assert result.stopped_at_s is not None and 1.5 < result.stopped_at_s < 3.0
    errors = [r.error for r in result.results]
    done = errors.count(None)
    cancelled = errors.count("cancelled: the replay stopped early")
    unsent = errors.count("not sent: the replay stopped early")
    assert done + cancelled + unsent == 20
    assert 3 <= done <= 8 and 1 <= cancelled <= 4 and unsent >= 8
    assert errors == [None] * done + errors[done:]  # in order of arrival


def test_a_wall_clock_step_during_the_window_is_reported(server, monkeypatch):
    """vLLM times requests with the wall clock; a clock set mid-window is measured and kept."""
    requests = [Request(0.1 * i, 4, 10) for i in range(5)]
    url = f"http://127.0.0.1:{server.server_port}"
    steady = replay_in_process(url, requests, settings())
    assert all(r.ok for r in steady.results)
    assert abs(steady.wall_clock_step_s) < 0.05

    real_time = time.time
    offset = [0.0]
    monkeypatch.setattr(time, "time", lambda: real_time() + offset[0])
    server.on_request = lambda: offset.__setitem__(0, -3.0)  # set back once the window runs
    stepped = replay_in_process(url, requests, settings())
    assert all(r.ok for r in stepped.results)
    assert stepped.wall_clock_step_s == pytest.approx(-3.0, abs=0.05)


def test_tuner_s_own_delays_are_measured(server, caplog):
    """A stall of tuner's own event loop is measured and warned about: its latencies include it."""
    requests = [Request(0.1 * i, 4, 10) for i in range(5)]
    stalls = []

    def stall_once(elapsed_s, live):
        if not stalls:
            stalls.append(elapsed_s)
            time.sleep(0.4)  # blocks the loop, as a starved client process would be
        return False

    url = f"http://127.0.0.1:{server.server_port}"
    result = replay_in_process(url, requests, settings(monitor_interval_s=0.1), monitor=stall_once)
    assert stalls and all(r.ok for r in result.results)
    assert 0.38 <= result.client_lag_max_s < 5.0
    assert result.client_lag_p99_s <= result.client_lag_max_s
    assert "tuner's own event loop ran up to" in caplog.text


@pytest.mark.vllm
def test_closed_loop_against_vllm(tmp_path, cpu_model):
    """Against vLLM, the requests in flight follow the target: 1, then 4, then 2, each phase as
    long as this machine needs to settle at the target and hold it a while."""
    engine = Engine(
        str(cpu_model),
        {**CPU_ENGINE_ARGS, "gpu-memory-utilization": 0.2},
        tmp_path,
    )  # fmt: skip
    settings = ReplaySettings(model=str(cpu_model), vocab_size=8192, gauge_interval_s=0.5)
    with engine:
        engine.wait_healthy(300)
        # Requests of the mean lengths, one at a time: 4 in flight take up to 6 times as long
        # (3.3 s against 0.56 s on 2 cores), which a fall from 4 waits for; then as long again.
        alone_s = []
        for seed in range(3):
            once = replay_in_process(
                engine.base_url, [Request(0.0, 100, 30)], replace(settings, seed=seed)
            )
            alone_s.append(once.results[0].e2e_s)
        phase_s = max(8.0, 12 * float(np.median(alone_s)))
        schedule = from_samples([0.0, phase_s, 2 * phase_s], [1, 4, 2])
        lengths = LengthSource.from_distributions("uniform:50:150", "uniform:20:40", seed=1)
        result = replay_closed_loop(
            engine.base_url, schedule, closed_loop_requests(lengths, seed=1), settings
        )
    assert all(r.ok for r in result.results), [r.error for r in result.results][:3]
    sent = np.array([r.sent_s for r in result.results])
    done = sent + np.array([r.e2e_s for r in result.results])
    # Every decision to send fills the target and never passes it (counted when the loop
    # decided, as in test_closed_loop_follows_the_target).
    decided = np.array([r.scheduled_s for r in result.results])
    at_send = np.array([np.count_nonzero((decided <= s) & (done > s)) for s in decided])
    targets = np.array([schedule.target_at(s) for s in decided])
    assert not [(s, n, t) for s, n, t in zip(decided, at_send, targets, strict=True) if n > t]
    times_s, counts = in_flight(sent, done)
    for phase, want in enumerate((1, 4, 2)):
        start, hi = phase * phase_s, (phase + 1) * phase_s - 0.5
        assert at_send[(decided >= start) & (decided < start + phase_s)].max() == want
        # Held at the target once there: from when the loop's sends reached it, or, where it
        # fell, from when enough of the requests sent before had finished (what either takes is
        # the machine's: beside vLLM on 2 cores, tuner's client is at times held up for seconds).
        reached = times_s[(times_s >= start) & (counts == want)]
        assert len(reached), (start, want)
        lo = max(start + 1.0, float(reached[0]))
        assert lo <= hi - 2.0, (f"at {want} from {lo:.1f} s, phase from {start:.1f} s", alone_s)
        inside = (times_s > lo) & (times_s < hi)
        window_s = np.concatenate(([lo], times_s[inside]))
        window_counts = np.concatenate(([counts[times_s <= lo][-1]], counts[inside]))
        assert window_counts.max() == want, (start, window_counts)
        mean = time_weighted(window_s, window_counts, hi)["mean"]
        assert mean == pytest.approx(want, abs=0.3), (start, window_counts)


def test_window_and_busiest_window_of_a_schedule():
    schedule = from_samples([0, 10, 20, 30, 40], [1, 8, 2, 8, 0])  # ends at 50
    assert busiest_window_start(schedule, 20) == 10.0  # 8+2 beats 2+8 on ties: earliest
    assert busiest_window_start(schedule, 15) == 10.0  # all of the first 8, half the 2
    assert busiest_window_start(schedule, 100) == 0.0
    part = schedule.window(15, 20)
    assert part.time_s.tolist() == [0.0, 5.0, 15.0]
    assert part.concurrency.tolist() == [8, 2, 8]
    assert part.end_s == 20.0
    assert [part.target_at(t) for t in (0, 4.9, 5, 19.9, 20)] == [8, 8, 2, 8, 0]
