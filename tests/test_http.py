"""One streamed request: every way it can fail comes back as a result with an error.

The server is a throw-away TCP server in a thread (real sockets) that answers each completion
with raw HTTP/1.1 bytes the test chooses, malformed ones included; the real open-loop ``replay``
talks to it, so that whatever a request raises would escape the replay, and a study with it.
"""

from __future__ import annotations

import asyncio
import json
import resource
import socketserver
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from tuner.load.http import ReplaySettings, send
from tuner.load.metrics import LiveRequest, RequestResult, provisional, summarize_client
from tuner.load.open_loop import replay_in_process
from tuner.traces.model import Request

OUTPUT_TOKENS = 3
HEADERS = (
    b"HTTP/1.1 200 OK\r\n"
    b"content-type: text/event-stream\r\n"
    b"transfer-encoding: chunked\r\n"
    b"connection: close\r\n\r\n"
)


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def events(*payloads: str) -> bytes:
    """A whole chunked body of server-sent events, ``[DONE]`` and the last chunk included."""
    body = b"".join(chunk(b"data: %s\n\n" % p.encode()) for p in (*payloads, "[DONE]"))
    return body + chunk(b"")


TOKEN = json.dumps({"choices": [{"text": "x"}]})
USAGE = json.dumps({"choices": [], "usage": {"completion_tokens": OUTPUT_TOKENS}})
WELL_FORMED = HEADERS + events(*[TOKEN] * OUTPUT_TOKENS, USAGE)


class ScriptedServer(socketserver.ThreadingTCPServer):
    """Answers the ``POST``s with ``responses`` in turn, byte for byte, closing each connection."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), ScriptedHandler)
        self.responses = [WELL_FORMED]
        self.posts = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class ScriptedHandler(socketserver.StreamRequestHandler):
    server: ScriptedServer

    def handle(self) -> None:
        request_line = self.rfile.readline()
        length = 0
        while (line := self.rfile.readline()) not in (b"\r\n", b"\n", b""):
            name, _, value = line.decode().partition(":")
            if name.strip().lower() == "content-length":
                length = int(value)
        self.rfile.read(length)
        if request_line.startswith(b"GET"):  # /metrics, read around the window
            self.wfile.write(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
            return
        responses = self.server.responses
        self.wfile.write(responses[self.server.posts % len(responses)])
        self.server.posts += 1


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    tcp = ScriptedServer()
    thread = threading.Thread(target=tcp.serve_forever, daemon=True)
    thread.start()
    yield tcp
    tcp.shutdown()
    tcp.server_close()


SETTINGS = ReplaySettings(model="m", vocab_size=100, gauge_interval_s=10.0)
REQUESTS = [Request(0.0, 4, OUTPUT_TOKENS), Request(0.05, 4, OUTPUT_TOKENS)]


def test_a_well_formed_stream_is_measured(server):
    result = replay_in_process(server.url, REQUESTS, SETTINGS)
    assert server.posts == 2
    assert all(r.ok and r.tokens_received == OUTPUT_TOKENS for r in result.results)


# What the server answers, and a part of the error each request must come back with.
MALFORMED = {
    "a JSON array": (events("[1, 2]", USAGE), "an array, not an object"),
    "a JSON string": (events('"x"', USAGE), "a string, not an object"),
    "JSON null": (events("null", USAGE), "null, not an object"),
    "a JSON number": (events("5", USAGE), "a number, not an object"),
    # Python's json refuses integers past 4300 digits with a ValueError, not a JSONDecodeError.
    "a number Python will not read": (events("1" * 5000, USAGE), "ValueError: Exceeds the limit"),
    "not JSON": (events("{not json", USAGE), "JSONDecodeError"),
    "choices a number": (
        events(*['{"choices": 5}'] * OUTPUT_TOKENS, USAGE),
        "choices is a number, not an array",
    ),
    "choices a string": (
        events(*['{"choices": "abc"}'] * OUTPUT_TOKENS, USAGE),
        "choices is a string, not an array",
    ),
    "usage a number": (
        events(*[TOKEN] * OUTPUT_TOKENS, '{"usage": 5}'),
        "usage is a number, not an object",
    ),
    "usage a list": (
        events(*[TOKEN] * OUTPUT_TOKENS, '{"usage": [3]}'),
        "usage is an array, not an object",
    ),
    "completion_tokens a string": (
        events(*[TOKEN] * OUTPUT_TOKENS, '{"choices": [], "usage": {"completion_tokens": "3"}}'),
        "completion_tokens is a string, not an integer",
    ),
    # The connection closes in the middle of the body: no last chunk, or a chunk cut short;
    # or in the middle of the headers (aiohttp's errors: the replay's transport).
    "closed between chunks": (
        chunk(b"data: %s\n\n" % TOKEN.encode()),
        "ClientPayloadError: Response payload is not completed",
    ),
    "closed inside a chunk": (
        chunk(b"data: %s\n\n" % TOKEN.encode())[:-9],
        "ClientPayloadError: Response payload is not completed",
    ),
    "closed inside the headers": (None, "ServerDisconnectedError"),
}


@pytest.mark.parametrize(("body", "error"), MALFORMED.values(), ids=MALFORMED.keys())
def test_a_malformed_stream_is_a_failed_request(server, body, error):
    """However the stream is broken, the replay finishes and records each request as failed."""
    server.responses = [HEADERS[:30] if body is None else HEADERS + body]
    result = replay_in_process(server.url, REQUESTS, SETTINGS)
    assert server.posts == 2
    assert len(result.results) == 2
    for r in result.results:
        assert not r.ok
        assert r.error is not None and error in r.error
        assert r.e2e_s is None


def test_a_failure_mid_stream_keeps_what_the_request_reached(server):
    """A stream that breaks after its first token keeps that token's time and the count."""
    server.responses = [HEADERS + events(TOKEN, TOKEN, '{"usage": 5}')]
    result = replay_in_process(server.url, REQUESTS[:1], SETTINGS)
    (r,) = result.results
    assert r.error and "usage" in r.error
    assert r.ttft_s is not None and r.tokens_received == 2


SHORT = HEADERS + events(TOKEN, TOKEN, json.dumps({"usage": {"completion_tokens": 2}}))
ERROR_500 = (
    b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 4\r\nconnection: close\r\n\r\nboom"
)
BROKEN = HEADERS + chunk(b"data: %s\n\n" % TOKEN.encode())


def test_the_pruner_s_figures_end_where_the_final_ones_begin(server):
    """At the window's end, the live figures the pruner watches are the final TTFT and end-to-end
    figures: a failed request counts as still waiting in the one, as a miss in the other."""
    server.responses = [WELL_FORMED, SHORT, ERROR_500, BROKEN]
    requests = [Request(0.02 * i, 4, OUTPUT_TOKENS) for i in range(12)]
    result = replay_in_process(server.url, requests, SETTINGS)
    assert [r.ok for r in result.results].count(True) == 3
    final = summarize_client(result.results, result.duration_s)
    live = provisional(result.duration_s, result.live)
    assert live.keys() == {k for k in final if k.startswith(("ttft_", "e2e_"))}
    for key, value in live.items():
        assert value == pytest.approx(final[key]), key


class ClosedStream(httpx.AsyncByteStream):
    """A response body that raises ``httpx.StreamClosed`` after one event.

    Not a realistic path: ``send`` reads each body once and before it closes, so httpx's stream
    errors (``StreamClosed``, ``StreamConsumed``, ``ResponseNotRead``) cannot arise from a
    server's answer. It checks that one, if it ever did, is still a failed request."""

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield b"data: %s\n\n" % TOKEN.encode()
        raise httpx.StreamClosed()


def test_an_httpx_stream_error_is_a_failed_request(caplog):
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, stream=ClosedStream())

    async def one() -> RequestResult:
        transport = httpx.MockTransport(answer)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return await send(
                client, b"{}", REQUESTS[0], 0.0, time.perf_counter(), time.perf_counter
            )

    r = asyncio.run(one())
    assert r.error and r.error.startswith("StreamClosed")
    assert r.ttft_s is not None and r.tokens_received == 1
    # Not a server's doing: logged with its traceback, so that a bug in tuner shows.
    (record,) = [rec for rec in caplog.records if rec.name == "tuner.load.http"]
    assert record.exc_info is not None and record.exc_info[0] is httpx.StreamClosed


def test_cancelling_a_request_still_cancels_it():
    """Cancellation is how a replay stops early: ``send`` must not record it as a failure."""

    async def cancelled() -> bool:
        started = asyncio.Event()

        async def answer(request: httpx.Request) -> httpx.Response:
            started.set()
            await asyncio.sleep(60)
            raise AssertionError("not cancelled")

        transport = httpx.MockTransport(answer)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            live = LiveRequest(0.0)
            task = asyncio.create_task(
                send(client, b"{}", REQUESTS[0], 0.0, time.perf_counter(), time.perf_counter, live)
            )
            await started.wait()
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            return task.cancelled()

    assert asyncio.run(cancelled())


_MANY_SOCKETS = """
import resource, socket, sys
from tuner.load.session import run

resource.setrlimit(resource.RLIMIT_NOFILE, (128, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))

async def many() -> int:
    sockets = [socket.socket() for _ in range(300)]
    for s in sockets:
        s.close()
    return len(sockets)

print(run(many()) if sys.argv[1] == "replay" else len([socket.socket() for _ in range(300)]))
"""


def test_a_replay_may_hold_more_connections_than_a_default_limit_of_open_files() -> None:
    """Many systems let a process open 1,024 files unless it asks for more, and a window (or
    its priming) can hold more connections than that: a replay asks, up to the hard limit."""
    if resource.getrlimit(resource.RLIMIT_NOFILE)[1] < 1024:
        pytest.skip("this machine's hard limit of open files is below 1,024")
    command = [sys.executable, "-c", _MANY_SOCKETS]
    replayed = subprocess.run([*command, "replay"], capture_output=True, text=True, check=False)
    assert replayed.returncode == 0 and replayed.stdout.strip() == "300", replayed.stderr
    # Without asking, the same process runs out of files.
    bare = subprocess.run([*command, "bare"], capture_output=True, text=True, check=False)
    assert bare.returncode != 0 and "Too many open files" in bare.stderr


_TERMINATED_IN_A_READ = """
import asyncio, os, signal, socket, threading
from tuner.cli.interrupts import raise_interrupt
from tuner.load.session import run

signal.signal(signal.SIGTERM, raise_interrupt)  # as `tuner` does
server = socket.socket()
server.bind(("127.0.0.1", 0))
server.listen()

def stream() -> None:
    conn, _ = server.accept()
    try:
        while True:
            conn.sendall(b"x" * 1024)
    except OSError:
        pass

threading.Thread(target=stream, daemon=True).start()

class Reader(asyncio.Protocol):
    signalled = False

    def data_received(self, data: bytes) -> None:
        if not Reader.signalled:  # the signal's Python handler runs here, inside the read
            Reader.signalled = True
            os.kill(os.getpid(), signal.SIGTERM)
            sum(range(1000))

async def replay() -> str:
    await asyncio.get_running_loop().create_connection(Reader, *server.getsockname())
    await asyncio.sleep(20)
    return "not interrupted"

try:
    print(run(replay()))
except KeyboardInterrupt:
    print("interrupted", signal.getsignal(signal.SIGTERM) is raise_interrupt)
"""


def test_sigterm_in_the_middle_of_a_stream_read_interrupts_the_replay() -> None:
    """tuner turns SIGTERM into an interrupt. A handler that raises runs wherever the signal
    lands: inside a stream read of uvloop's, uvloop logged the exception, dropped that one
    connection and went on replaying. The replay's loop now takes SIGTERM itself, cancels the
    replay and raises KeyboardInterrupt, and gives tuner's handler back."""
    done = subprocess.run(
        [sys.executable, "-c", _TERMINATED_IN_A_READ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.stdout.strip() == "interrupted True", done.stdout + done.stderr
