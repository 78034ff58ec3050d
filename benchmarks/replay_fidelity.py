"""Replay fidelity: how late ``tuner.load.open_loop`` sends each request against its schedule.

Starts a throw-away streaming ``/v1/completions`` server that answers at once (raw asyncio, its
own process on 127.0.0.1), replays Poisson arrivals at 50, 200 and 500 req/s through
``tuner.load.open_loop.replay``, and reports p50 and p99 of the ``send_lag`` it records (actual send
time minus scheduled time), as medians over repeats. Target: p99 <= 5 ms at 200 req/s.

    python benchmarks/replay_fidelity.py            # the full run, about a minute
    python benchmarks/replay_fidelity.py --rates 200 --repeats 5 --duration-s 10
    python benchmarks/replay_fidelity.py --hold-s 2   # 2 s streams: rate x 2 in flight
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shlex
import socket
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tuner.load.http import ReplaySettings
from tuner.load.open_loop import replay
from tuner.traces.model import Request

TARGET_RATE_PER_S = 200
TARGET_P99_MS = 5.0


# The server: the least an OpenAI-style streaming endpoint can do.


def _chunk(payload: bytes) -> bytes:
    line = b"data: " + payload + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(line), line)


async def _handle(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, hold_s: float = 0.0
) -> None:
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
                out = [b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"]
                out.append(b"transfer-encoding: chunked\r\n\r\n")
                first = 0
                if hold_s:  # the first token at once, the rest after hold_s
                    out.append(_chunk(b'{"choices":[{"index":0,"text":" t0"}]}'))
                    writer.write(b"".join(out))
                    out, first = [], 1
                    await asyncio.sleep(hold_s)
                for i in range(first, tokens):
                    out.append(_chunk(b'{"choices":[{"index":0,"text":" t%d"}]}' % i))
                usage = b'{"choices":[],"usage":{"completion_tokens":%d}}' % tokens
                out += [_chunk(usage), _chunk(b"[DONE]"), b"0\r\n\r\n"]
                writer.write(b"".join(out))
            else:
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def _serve(port: int, hold_s: float) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _handle(reader, writer, hold_s)

    server = await asyncio.start_server(handle, "127.0.0.1", port, backlog=4096)
    print("ready", flush=True)
    async with server:
        await server.serve_forever()


def start_server(hold_s: float = 0.0) -> tuple[subprocess.Popen[bytes], str]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    process = subprocess.Popen(
        [sys.executable, __file__, "--serve", str(port), "--hold-s", str(hold_s)],
        stdout=subprocess.PIPE,
    )
    assert process.stdout is not None
    if process.stdout.readline().strip() != b"ready":
        raise SystemExit("the stand-in server did not start")
    return process, f"http://127.0.0.1:{port}"


# The measurement.


def poisson_requests(rate_per_s: float, duration_s: float, seed: int) -> list[Request]:
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1.0 / rate_per_s, size=int(rate_per_s * duration_s * 1.5) + 10)
    arrivals = np.cumsum(gaps) - gaps[0]
    return [Request(float(t), 16, 4) for t in arrivals[arrivals < duration_s]]


def measure(base_url: str, rate_per_s: float, duration_s: float, seed: int) -> dict[str, float]:
    requests = poisson_requests(rate_per_s, duration_s, seed)
    settings = ReplaySettings(model="m", vocab_size=1000, request_timeout_s=30, drain_timeout_s=60)
    result = replay(base_url, requests, settings)
    lag_ms = np.array([r.sent_s - r.scheduled_s for r in result.results]) * 1000
    failed = sum(1 for r in result.results if not r.ok)
    if failed:
        first = next(r.error for r in result.results if not r.ok)
        print(f"  warning: {failed} of {len(requests)} requests failed, e.g. {first}")
    return {
        "requests": len(requests),
        "p50_ms": float(np.percentile(lag_ms, 50)),
        "p99_ms": float(np.percentile(lag_ms, 99)),
        "max_ms": float(lag_ms.max()),
        "failed": failed,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", type=float, nargs="+", default=[50, 200, 500])
    parser.add_argument("--duration-s", type=float, default=5.0, help="per replay")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--hold-s",
        type=float,
        default=0.0,
        help="the server holds each stream open this long after its first token, so that "
        "rate x hold requests are in flight (default 0: it answers at once)",
    )
    parser.add_argument("--serve", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        asyncio.run(_serve(args.serve, args.hold_s))
        return 0

    load = os.getloadavg()
    print(
        f"replay fidelity on {platform.node()}: {os.cpu_count()} CPUs, python "
        f"{platform.python_version()}, load average before {load[0]:.2f}"
    )
    server, base_url = start_server(args.hold_s)
    rows = []
    try:
        for rate in args.rates:
            runs = [measure(base_url, rate, args.duration_s, seed) for seed in range(args.repeats)]
            row = {
                key: statistics.median(run[key] for run in runs)
                for key in ("requests", "p50_ms", "p99_ms", "max_ms")
            }
            rows.append((rate, row, runs))
            each = ", ".join(f"{run['p99_ms']:.2f}" for run in runs)
            print(f"  {rate:>5g} req/s: p99 per repeat {each} ms")
    finally:
        server.terminate()
        server.wait()

    print(
        f"\nsend lag (actual send - scheduled), median of {args.repeats} repeats "
        f"of {args.duration_s:g} s each:"
    )
    print(f"{'rate':>10} {'requests':>9} {'p50':>9} {'p99':>9} {'max':>9}")
    for rate, row, _ in rows:
        print(
            f"{rate:>6g}/s {row['requests']:>9.0f} {row['p50_ms']:>6.2f} ms "
            f"{row['p99_ms']:>6.2f} ms {row['max_ms']:>6.2f} ms"
        )
    target = next((row for rate, row, _ in rows if rate == TARGET_RATE_PER_S), None)
    if target is not None:
        met = target["p99_ms"] <= TARGET_P99_MS
        print(
            f"target p99 <= {TARGET_P99_MS:g} ms at {TARGET_RATE_PER_S} req/s: "
            f"{'met' if met else 'MISSED'} ({target['p99_ms']:.2f} ms)"
        )
    print(f"load average after {os.getloadavg()[0]:.2f}")
    rerun = shlex.join([sys.executable, "benchmarks/replay_fidelity.py", *(argv or sys.argv[1:])])
    print(f"rerun: {rerun}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
