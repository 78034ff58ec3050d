"""Does tuner's client keep up, and how far apart do its latencies and vLLM's go when it cannot?

Starts one vLLM engine (the CPU demo model) and replays the shipped trace's busiest second,
stretched ``--time-scale`` times, ``--repeats`` times with nothing else running and as many times
with ``--busy`` processes spinning beside it. For each replay it prints tuner's TTFT and
end-to-end means next to vLLM's (from ``/metrics``), tuner's own event-loop lag
(``client_lag_max_s``, ``client_lag_p99_s``), and the worst lag of a separate process that only
sleeps 10 ms at a time: whether a hold-up is tuner's own or the whole machine's.

    python benchmarks/client_lag.py --repeats 3 --busy 2

The busy processes run in this benchmark's session (``--busy-session tuner``, as loops started
from tuner's own shell) or each in a session of its own (``own``, as other shells' work). vLLM
runs in tuner's session, as tuner starts it, or with ``--engine-session own`` in one of its own,
as tuner started it until 2026-11-26: Linux's autogroup scheduler shares the CPU between sessions
first (benchmarks/results/cpu-client-lag/).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event
from pathlib import Path

from tuner.engine import (
    Engine,
    Launch,
    LocalServer,
    ProcessLauncher,
    die_with,
    free_port,
    write_model,
)
from tuner.load import ReplaySettings, replay_figures, replay_in_process
from tuner.traces import build_workload, load_trace

TRACE = Path(__file__).resolve().parent.parent / "traces" / "azure-conv-peak.csv"


class OwnSessionLauncher(ProcessLauncher):
    """tuner's launcher as it was until 2026-11-26: each server in a session of its own."""

    def launch(self, server: Launch) -> LocalServer:
        port = free_port()
        with server.log.open("ab") as out:
            popen = subprocess.Popen(
                self.command(server, port),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **server.env},
                start_new_session=True,
                preexec_fn=die_with(os.getpid()),
            )
        return LocalServer(popen.pid, popen, port, server.log, server.name, server.health_path)


def spin(stop: Event) -> None:
    while not stop.is_set():
        for _ in range(100_000):
            pass


def sleeper(stop: Event, worst: Queue[float]) -> None:
    """Sleep 10 ms at a time until ``stop``; put the latest wake-up seen."""

    async def probe() -> float:
        loop = asyncio.get_running_loop()
        late = 0.0
        while not stop.is_set():
            due = loop.time() + 0.01
            await asyncio.sleep(0.01)
            late = max(late, loop.time() - due)
        return late

    worst.put(asyncio.run(probe()))


@contextlib.contextmanager
def beside(busy: int, own_sessions: bool, into: dict[str, float]) -> Iterator[None]:
    """``busy`` spinning processes (``own_sessions``: each a shell loop in a session of its own)
    and one sleeping probe, whose worst lag lands in ``into``."""
    stop = multiprocessing.Event()
    worst: Queue[float] = multiprocessing.Queue()
    procs = [multiprocessing.Process(target=sleeper, args=(stop, worst))]
    loops: list[subprocess.Popen[bytes]] = []
    if own_sessions:
        loop = ["bash", "-c", "while :; do :; done"]
        loops = [subprocess.Popen(loop, start_new_session=True) for _ in range(busy)]
    else:
        procs += [multiprocessing.Process(target=spin, args=(stop,)) for _ in range(busy)]
    for proc in procs:
        proc.start()
    try:
        yield
    finally:
        stop.set()
        for spinning in loops:
            spinning.kill()
            spinning.wait()
        into["sleeper_lag_max_s"] = worst.get(timeout=60)
        for proc in procs:
            proc.join()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--busy", type=int, default=2, help="spinning processes beside tuner")
    parser.add_argument("--window-s", type=float, default=1.0)
    parser.add_argument("--time-scale", type=float, default=4.0)
    parser.add_argument("--busy-session", choices=("tuner", "own"), default="tuner")
    parser.add_argument("--engine-session", choices=("tuner", "own"), default="tuner")
    options = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="client-lag-"))
    model = str(write_model(work / "model", "cpu-demo"))
    args = {"load-format": "dummy", "max-model-len": 4096, "enforce-eager": True}
    args["gpu-memory-utilization"] = 0.2
    workload = build_workload(load_trace(TRACE), options.window_s, options.time_scale, 4096)
    requests = workload.trace.requests()
    settings = ReplaySettings(model=model, vocab_size=8192)
    print(f"{workload.describe()}: {len(requests)} requests", flush=True)
    rows: list[tuple[int, dict[str, float]]] = []
    began = time.monotonic()
    own = options.engine_session == "own"
    launcher = OwnSessionLauncher() if own else ProcessLauncher()
    with Engine(model, args, work / "engine", launcher=launcher) as engine:
        engine.wait_healthy(900)
        replay_in_process(
            engine.base_url, requests, settings
        )  # a fresh engine's first requests are slow
        print(
            f"{'busy':>4} {'ttft':>6} {'vllm':>6} {'e2e':>6} {'vllm':>6} "
            f"{'lag max':>8} {'lag p99':>8} {'sleeper':>8}   (seconds, means)"
        )
        for _ in range(options.repeats):
            for busy in (0, options.busy):
                sleeper_lag: dict[str, float] = {}
                with beside(busy, options.busy_session == "own", sleeper_lag):
                    result = replay_in_process(engine.base_url, requests, settings)
                figures = replay_figures(result) | sleeper_lag
                rows.append((busy, figures))
                print(
                    f"{busy:>4} {figures['ttft_mean_s']:6.2f} {figures['server_ttft_mean_s']:6.2f} "
                    f"{figures['e2e_mean_s']:6.2f} {figures['server_e2e_mean_s']:6.2f} "
                    f"{figures['client_lag_max_s']:8.3f} {figures['client_lag_p99_s']:8.3f} "
                    f"{figures.get('sleeper_lag_max_s', float('nan')):8.3f}",
                    flush=True,
                )
    print("\nmedians over the repeats")
    for busy in sorted({b for b, _ in rows}):
        group = [f for b, f in rows if b == busy]

        def median(key: str, of: list[dict[str, float]] = group) -> float:
            return statistics.median(f.get(key, float("nan")) for f in of)

        gap = statistics.median(f["e2e_mean_s"] / f["server_e2e_mean_s"] - 1 for f in group)
        print(
            f"busy {busy}: e2e tuner/vLLM {gap:+.1%}, tuner lag max "
            f"{median('client_lag_max_s'):.3f} s, sleeper lag max "
            f"{median('sleeper_lag_max_s'):.3f} s"
        )
    print(f"\ntook {time.monotonic() - began:.0f} s; rerun: python {' '.join(sys.argv)}")


if __name__ == "__main__":
    main()
