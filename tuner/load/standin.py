"""A streaming stand-in for vLLM's ``/v1/completions`` whose latencies are known.

It answers every completion with ``max_tokens`` server-sent events shaped like vLLM's, the first
``ttft_s`` after the request's body arrived and the others ``itl_s`` apart, and keeps, per request,
when its body arrived and when its first event was written (``GET /stats`` returns them and
forgets them). What a client measures against it, less what the stand-in recorded, is the
client's own error: ``benchmarks/replay_fidelity.py`` measures tuner's replay client this way,
and tests use it where the point is the client, not vLLM.

Run it in its own process, so that it does not share the client's CPU::

    python -m tuner.load.standin --port 8123 --ttft-ms 20 --itl-ms 10 --cpu 0

Where one core cannot write the events fast enough, several stand-ins share a port
(``--shared``), each answering ``/stats`` for its own requests on a port of its own. The times
it records are ``time.monotonic()``: the same clock as the client's ``time.perf_counter()`` on
Linux, so the two can be compared across processes.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import socket
import sys
import time
from dataclasses import dataclass

from tuner.load.session import run

_EVENT = (
    b'{"id":"cmpl-standin","object":"text_completion","created":0,"model":"standin",'
    b'"choices":[{"index":0,"text":" tok","logprobs":null,"finish_reason":null,'
    b'"stop_reason":null}],"usage":null}'
)
_LAST = (
    b'{"id":"cmpl-standin","object":"text_completion","created":0,"model":"standin",'
    b'"choices":[],"usage":{"prompt_tokens":0,"total_tokens":%d,"completion_tokens":%d}}'
)
_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


def chunk(payload: bytes) -> bytes:
    """One server-sent event as one HTTP/1.1 chunk."""
    line = b"data: " + payload + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(line), line)


TOKEN = chunk(_EVENT)
DONE = chunk(b"[DONE]") + b"0\r\n\r\n"


def body_key(body: bytes) -> str:
    """The key ``/stats`` names a request by: a digest of its body."""
    return hashlib.blake2b(body, digest_size=8).hexdigest()


def plain(status: bytes, body: bytes, content_type: bytes = b"text/plain") -> bytes:
    """A whole HTTP/1.1 response with ``body``."""
    return (
        b"HTTP/1.1 "
        + status
        + b"\r\ncontent-type: "
        + content_type
        + b"\r\ncontent-length: %d\r\n\r\n" % len(body)
        + body
    )


@dataclass
class Settings:
    """The stand-in server's latencies: time to the first token, then between tokens."""

    ttft_s: float = 0.02
    itl_s: float = 0.01


class _Stream:
    """One response being streamed: its events are written on a grid of ``itl_s``."""

    __slots__ = ("conn", "due", "record", "sent", "tokens")

    def __init__(self, conn: _Connection, tokens: int, due: float, record: list[float]) -> None:
        self.conn, self.tokens, self.due, self.record, self.sent = conn, tokens, due, record, 0


class _Connection(asyncio.Protocol):
    def __init__(self, server: _Server) -> None:
        self.server = server
        self.buffer = b""
        self.transport: asyncio.Transport | None = None
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while (end := self.buffer.find(b"\r\n\r\n")) >= 0:
            head = self.buffer[:end]
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            if len(self.buffer) < end + 4 + length:
                return
            body = self.buffer[end + 4 : end + 4 + length]
            self.buffer = self.buffer[end + 4 + length :]
            method, path = head.split(b" ", 2)[:2]
            self.server.answer(self, method, path, body)

    def write(self, data: bytes) -> None:
        if not self.closed and self.transport is not None:
            self.transport.write(data)


class _Server:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.loop = asyncio.get_running_loop()
        # body key -> [arrived, first event written], time.monotonic() seconds
        self.records: dict[str, list[float]] = {}

    def answer(self, conn: _Connection, method: bytes, path: bytes, body: bytes) -> None:
        if method == b"POST" and path == b"/v1/completions":
            arrived = time.monotonic()
            tokens = int(json.loads(body)["max_tokens"])
            record = self.records[body_key(body)] = [arrived, 0.0]
            conn.write(_HEAD)
            due = self.loop.time() + self.settings.ttft_s
            stream = _Stream(conn, tokens, due, record)
            self.loop.call_at(due, self.next_event, stream)
        elif path == b"/stats":
            text = json.dumps(self.records).encode()
            self.records = {}
            conn.write(plain(b"200 OK", text, b"application/json"))
        else:  # /health, /metrics and the rest: empty and well
            conn.write(plain(b"200 OK", b""))

    def next_event(self, stream: _Stream) -> None:
        if stream.conn.closed:
            return
        if stream.sent < stream.tokens:
            if stream.sent == 0:  # stamped before the write: the client may read it at once
                stream.record[1] = time.monotonic()
            stream.conn.write(TOKEN)
            stream.sent += 1
        if stream.sent < stream.tokens:
            stream.due += self.settings.itl_s
            self.loop.call_at(stream.due, self.next_event, stream)
        else:
            stream.conn.write(chunk(_LAST % (stream.tokens, stream.tokens)) + DONE)


async def serve(socks: list[socket.socket], settings: Settings) -> None:
    """Serve on the listening sockets until cancelled."""
    loop = asyncio.get_running_loop()
    state = _Server(settings)
    servers = [
        await loop.create_server(lambda: _Connection(state), sock=sock, backlog=4096)
        for sock in socks
    ]
    await asyncio.gather(*(server.serve_forever() for server in servers))


def listening_socket(port: int, shared: bool = False) -> socket.socket:
    """A socket listening on 127.0.0.1:``port`` (``shared``: several processes on one port)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if shared:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(4096)
    return sock


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True, help="0: any free port")
    parser.add_argument("--ttft-ms", type=float, default=20.0)
    parser.add_argument("--itl-ms", type=float, default=10.0)
    parser.add_argument("--cpu", type=int, nargs="*", help="pin the process to these CPUs")
    parser.add_argument(
        "--shared",
        action="store_true",
        help="share --port with other stand-ins (SO_REUSEPORT), where one core cannot write "
        "the events fast enough; each also listens on a port of its own, for its /stats",
    )
    args = parser.parse_args(argv)
    if args.cpu:
        os.sched_setaffinity(0, args.cpu)
    socks = [listening_socket(args.port, args.shared)]
    if args.shared:
        socks.append(listening_socket(0))
    settings = Settings(args.ttft_ms / 1000, args.itl_ms / 1000)
    # "ready PORT [OWN_PORT]": the port it serves, and where --shared its own.
    print("ready", *(sock.getsockname()[1] for sock in socks), flush=True)
    run(serve(socks, settings))  # on uvloop where installed: a faster stand-in, not a different one
    return 0


if __name__ == "__main__":
    sys.exit(main())
