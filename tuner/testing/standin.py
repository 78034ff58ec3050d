"""A stand-in for vLLM's OpenAI server whose latencies are known, for tests and benchmarks where
the point is tuner (its replay client, what it does when a server fails) and not vLLM.

Like vLLM, it serves ``/health``, ``/metrics`` (``vllm:request_success_total``, and the gauges
``vllm:num_requests_running`` and ``vllm:num_requests_waiting``) and streamed
``/v1/completions``: each completion is ``max_tokens`` server-sent events shaped like vLLM's,
the first ``ttft_s`` after the request's body arrived (or, where ``slots`` are all taken, after
it got one) and the others ``itl_s`` apart, then the usage and ``[DONE]``. It keeps, per
request, when its body arrived and when its first event was written: ``GET /stats`` returns
them and forgets them. What a client measures against it, less what it recorded, is the
client's own error (``benchmarks/replay_fidelity.py`` measures tuner's replay client so). The
times it records are ``time.monotonic()``: the same clock as the client's
``time.perf_counter()`` on Linux, so the two can be compared across processes. One event loop
writes every stream (uvloop's where installed), so that the stand-in stays fast.

It runs in a process of its own, so that it does not share the client's CPU, started one of two
ways::

    python -m tuner.testing.standin --port 8123 --ttft-ms 20 --itl-ms 10 --cpu 0
    python -m tuner.testing.standin --config FILE.yaml

The first listens on 127.0.0.1 and prints ``ready PORT`` (``start`` runs it so). Where one core
cannot write the events fast enough, several stand-ins share a port (``--shared``), each
answering ``/stats`` for its own requests on a port of its own: ``ready PORT OWN_PORT``.

The second is vLLM's own shape, ``python -m vllm.entrypoints.openai.api_server --config FILE``
(``tuner.testing.install_as_vllm`` installs it under that name, and as the modules ``vllm
serve`` needs, for a server whose config names ``api-server-count`` or ``data-parallel-size``:
``ServeSubcommand``): it listens on the YAML's
``host`` and ``port``, starts a worker process (vLLM's engine core) that it stops on SIGTERM,
and reads its ``Settings`` from the environment (``Settings.from_environment``).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import yaml

from tuner.load.event_loop import loop_factory, open_files

_EVENT = (
    b'{"id":"cmpl-standin","object":"text_completion","created":0,"model":"standin",'
    b'"choices":[{"index":0,"text":" tok","logprobs":null,"finish_reason":null,'
    b'"stop_reason":null}],"usage":null}'
)
_LAST = (
    b'{"id":"cmpl-standin","object":"text_completion","created":0,"model":"standin",'
    b'"choices":[],"usage":{"prompt_tokens":%d,"total_tokens":%d,"completion_tokens":%d}}'
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


@dataclass(frozen=True)
class Settings:
    """How the stand-in answers: the time to the first token, then between tokens; ``slots``,
    the requests streamed at once (0: no limit), the others waiting for one before their first
    token, so that the server has a capacity as a real one does; ``stall_after``, the tokens
    after which every stream stops with its connection held open (-1: never); ``jit_at``, the
    request numbers (1: the first to arrive) at which it logs what vLLM 0.26's JIT monitor logs
    for a kernel compiled while serving."""

    ttft_s: float = 0.02
    itl_s: float = 0.01
    slots: int = 0
    stall_after: int = -1
    jit_at: frozenset[int] = frozenset()

    @classmethod
    def from_environment(
        cls, config: Mapping[str, Any], env: Mapping[str, str] = os.environ
    ) -> Settings:
        """The settings of a server started as vLLM, with the YAML ``config``:

        - ``STAND_IN_TOKEN_S``: seconds to the first token and between tokens (default 0.002);
        - ``STAND_IN_SLOTS``: ``slots`` (default: no limit);
        - ``STAND_IN_STALL_AFTER``: ``stall_after``, only where ``config`` sets no
          ``max-num-seqs`` (vLLM's defaults: a study's baseline);
        - ``STAND_IN_JIT_AT``: ``jit_at``, comma-separated (``3,30``).

        ``config``'s ``tensor-parallel-size`` t and ``data-parallel-size`` d (each 1 where not
        given) make a server of t x d GPUs: t x d times the slots (d copies of the model, each
        with t GPUs' KV cache) and tokens t times faster. So its capacity per GPU grows with t
        and not with d: of the layouts of one t, the smallest server carries as much per GPU.
        """
        tensor, data = (
            int(config.get(k, 1)) for k in ("tensor-parallel-size", "data-parallel-size")
        )
        token_s = float(env.get("STAND_IN_TOKEN_S", "0.002")) / tensor
        stall_after = int(env.get("STAND_IN_STALL_AFTER", "-1"))
        return cls(
            ttft_s=token_s,
            itl_s=token_s,
            slots=max(0, int(env.get("STAND_IN_SLOTS", "0"))) * tensor * data,
            stall_after=-1 if "max-num-seqs" in config else stall_after,
            jit_at=frozenset(int(n) for n in env.get("STAND_IN_JIT_AT", "").split(",") if n),
        )


def _engine_core(line: str) -> None:
    """A line as vLLM's engine core logs it."""
    print(f"(EngineCore pid={os.getpid()}) {line}", flush=True)


def log_jit_monitor() -> None:
    """What vLLM 0.26's JIT monitor logs at start-up."""
    _engine_core(
        "INFO 11-25 07:40:00 [jit_monitor.py:79] Kernel JIT monitor activated; monitored JIT "
        "compilations during inference will use mode=warn."
    )


def log_jit(n: int) -> None:
    """What vLLM 0.26's JIT monitor logs for a kernel compiled while serving the ``n``-th
    request."""
    _engine_core(
        "WARNING 11-25 07:40:01 [jit_monitor.py:132] Triton kernel JIT compilation during "
        f"inference: _kernel_{n}. This causes a latency spike; consider extending warmup to "
        "cover this shape/config."
    )


class _Stream:
    """One response being streamed: its events are written on a grid of ``itl_s``."""

    __slots__ = ("conn", "due", "prompt_tokens", "record", "sent", "tokens")

    def __init__(
        self, conn: _Connection, tokens: int, prompt_tokens: int, record: list[float]
    ) -> None:
        self.conn, self.tokens, self.prompt_tokens = conn, tokens, prompt_tokens
        self.record, self.due, self.sent = record, 0.0, 0


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
        self.arrived = self.succeeded = self.streaming = 0
        self.waiting: deque[_Stream] = deque()  # for a slot

    def answer(self, conn: _Connection, method: bytes, path: bytes, body: bytes) -> None:
        if method == b"POST" and path == b"/v1/completions":
            self.completion(conn, body)
        elif path == b"/stats":
            text = json.dumps(self.records).encode()
            self.records = {}
            conn.write(plain(b"200 OK", text, b"application/json"))
        elif path == b"/health":
            conn.write(plain(b"200 OK", b""))
        elif path == b"/metrics":
            conn.write(plain(b"200 OK", self.metrics()))
        else:
            conn.write(plain(b"404 Not Found", b"not found"))

    def metrics(self) -> bytes:
        """vLLM's request counter and its gauges of the requests streaming and waiting for a
        slot, which tuner waits on to be idle before a window."""
        waiting = sum(not stream.conn.closed for stream in self.waiting)
        return (
            b"# TYPE vllm:request_success_total counter\n"
            b'vllm:request_success_total{model_name="standin"} %d\n'
            b"# TYPE vllm:num_requests_running gauge\n"
            b'vllm:num_requests_running{model_name="standin"} %d\n'
            b"# TYPE vllm:num_requests_waiting gauge\n"
            b'vllm:num_requests_waiting{model_name="standin"} %d\n'
        ) % (self.succeeded, self.streaming, waiting)

    def completion(self, conn: _Connection, body: bytes) -> None:
        arrived = time.monotonic()
        request = json.loads(body)
        record = self.records[body_key(body)] = [arrived, 0.0]
        self.arrived += 1
        if self.arrived in self.settings.jit_at:
            log_jit(self.arrived)
        stream = _Stream(conn, int(request["max_tokens"]), len(request.get("prompt", "")), record)
        if self.settings.slots and self.streaming >= self.settings.slots:
            self.waiting.append(stream)
        else:
            self.begin(stream)

    def begin(self, stream: _Stream) -> None:
        self.streaming += 1
        stream.conn.write(_HEAD)
        stream.due = self.loop.time() + self.settings.ttft_s
        self.loop.call_at(stream.due, self.next_event, stream)

    def next_event(self, stream: _Stream) -> None:
        if stream.conn.closed:
            self.end(stream, succeeded=False)
            return
        if stream.sent < stream.tokens:
            if stream.sent == self.settings.stall_after:
                return  # a server that accepted and stopped streaming: the connection held
            if stream.sent == 0:  # stamped before the write: the client may read it at once
                stream.record[1] = time.monotonic()
            stream.conn.write(TOKEN)
            stream.sent += 1
        if stream.sent < stream.tokens:
            stream.due += self.settings.itl_s
            self.loop.call_at(stream.due, self.next_event, stream)
        else:
            usage = (stream.prompt_tokens, stream.prompt_tokens + stream.tokens, stream.tokens)
            stream.conn.write(chunk(_LAST % usage) + DONE)
            self.end(stream, succeeded=True)

    def end(self, stream: _Stream, succeeded: bool) -> None:
        """``stream`` is over: its slot goes to the first request waiting for one."""
        self.succeeded += succeeded
        self.streaming -= 1
        while self.waiting:
            waiting = self.waiting.popleft()
            if not waiting.conn.closed:  # one whose client left is dropped, as vLLM aborts it
                self.begin(waiting)
                break


async def serve(
    socks: list[socket.socket], settings: Settings, on_sigterm: Callable[[], None] | None = None
) -> None:
    """Serve on the listening sockets until cancelled, calling ``on_sigterm`` on SIGTERM where
    given; a cancellation waits on no connection (one held open by ``stall_after`` included)."""
    loop = asyncio.get_running_loop()
    if on_sigterm is not None:
        loop.add_signal_handler(signal.SIGTERM, on_sigterm)
    state = _Server(settings)
    servers = [
        await loop.create_server(lambda: _Connection(state), sock=sock, backlog=4096)
        for sock in socks
    ]
    try:
        await loop.create_future()
    finally:
        for server in servers:
            server.close()


def run(main: Coroutine[Any, Any, None]) -> None:
    """Run ``main`` on uvloop's event loop where it is installed (a faster stand-in, not a
    different one), else asyncio's, once this process may open as many files as a replay may
    (``tuner.load.event_loop``: a connection is one). Ctrl-C raises ``KeyboardInterrupt``. Of
    tuner's, the stand-in imports that module alone (the standard library's), so that it starts
    as fast as a bare interpreter with PyYAML."""
    open_files()
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        runner.run(main)


def listening_socket(port: int, shared: bool = False, host: str = "127.0.0.1") -> socket.socket:
    """A socket listening on ``host``:``port`` (``shared``: several processes on one port)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if shared:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(4096)
    return sock


# vLLM's engine core, as far as a test can tell: a child process that exits on SIGTERM.
WORKER = """
import os, signal, sys, time
from pathlib import Path
pids = os.environ.get("STAND_IN_PIDS")
if pids:
    Path(pids, str(os.getpid())).write_text("worker")
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
while True:
    time.sleep(1)
"""


def stop_worker(worker: subprocess.Popen[bytes]) -> None:
    """Stop the worker: SIGTERM, then SIGKILL after 5 s."""
    worker.terminate()
    try:
        worker.wait(timeout=5)
    except subprocess.TimeoutExpired:
        worker.kill()


def serve_as_vllm(config_path: Path, env: Mapping[str, str] = os.environ) -> NoReturn:
    """Serve as ``python -m vllm.entrypoints.openai.api_server --config FILE`` does, on the
    YAML's ``host`` and ``port``, with ``Settings.from_environment``; ``STAND_IN_PIDS``: a
    folder where the server and its worker each write a file named by its pid. Its log says
    its pid, its config and ``CUDA_VISIBLE_DEVICES``, then ``startup complete`` once it
    listens. SIGTERM (or Ctrl-C) ends it with status 0, its worker stopped first; anything
    else that ends it (its port taken) stops the worker too, and raises."""
    config = yaml.safe_load(config_path.read_text())
    settings = Settings.from_environment(config, env)
    if pids := env.get("STAND_IN_PIDS"):
        Path(pids, str(os.getpid())).write_text("server")
    gpus = env.get("CUDA_VISIBLE_DEVICES")
    print(f"stand-in vLLM pid={os.getpid()} config={config} gpus={gpus}", flush=True)
    if settings.jit_at:
        log_jit_monitor()
    worker = subprocess.Popen([sys.executable, "-c", WORKER])

    def stopped(*_: object) -> NoReturn:
        # Once: a second SIGTERM arriving inside worker.wait() re-entered it and deadlocked on
        # its lock (seen once in a full suite run: the server outlived a SIGKILLed tuner).
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        stop_worker(worker)
        os._exit(0)

    signal.signal(signal.SIGTERM, stopped)  # until the loop takes it over
    try:
        sock = listening_socket(int(config["port"]), host=str(config["host"]))
        print("stand-in vLLM: startup complete", flush=True)
        run(serve([sock], settings, on_sigterm=stopped))
    except KeyboardInterrupt:
        pass  # Ctrl-C
    except BaseException:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        stop_worker(worker)
        raise
    stopped()


# ``vllm serve`` (``tuner.engine.serve``), standing in: the names that module imports from vLLM.
FlexibleArgumentParser = argparse.ArgumentParser


def cli_env_setup() -> None:
    """vLLM's environment set-up: nothing to set up here."""


class ServeSubcommand:
    """``vllm serve``: reads ``--config`` and serves as vLLM (``serve_as_vllm``)."""

    def subparser_init(self, subparsers: argparse._SubParsersAction[Any]) -> None:
        subparsers.add_parser("serve").add_argument("--config", type=Path, required=True)

    def validate(self, args: argparse.Namespace) -> None:
        """vLLM checks the arguments here; the stand-in takes any."""

    def cmd(self, args: argparse.Namespace) -> None:
        serve_as_vllm(args.config)


def serve_at_port(port: int, settings: Settings, shared: bool = False) -> None:
    """Serve on 127.0.0.1:``port`` (0: any free port) until killed, having printed
    ``ready PORT``; where ``shared``, on a port of its own too: ``ready PORT OWN_PORT``."""
    socks = [listening_socket(port, shared)]
    if shared:
        socks.append(listening_socket(0))
    print("ready", *(sock.getsockname()[1] for sock in socks), flush=True)
    run(serve(socks, settings))


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--port", type=int, help="on 127.0.0.1; 0: any free port")
    where.add_argument(
        "--config",
        type=Path,
        help="serve as vLLM's api_server: host and port from this YAML, settings from the "
        "environment (STAND_IN_*), a worker process; the options below do not apply",
    )
    parser.add_argument("--ttft-ms", type=float, default=20.0)
    parser.add_argument("--itl-ms", type=float, default=10.0)
    parser.add_argument("--cpu", type=int, nargs="*", help="pin the process to these CPUs")
    parser.add_argument(
        "--shared",
        action="store_true",
        help="share --port with other stand-ins (SO_REUSEPORT), where one core cannot write "
        "the events fast enough; each also listens on a port of its own, for its /stats",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """The command line (the module's docstring); ``argv``: ``sys.argv[1:]`` where None."""
    args = parser().parse_args(argv)
    if args.cpu:
        os.sched_setaffinity(0, args.cpu)
    if args.config is not None:
        serve_as_vllm(args.config)
    serve_at_port(args.port, Settings(args.ttft_ms / 1000, args.itl_ms / 1000), args.shared)
    return 0


if __name__ == "__main__":
    sys.exit(main())
