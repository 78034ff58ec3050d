"""Loading and windowing a 1,000,000-row trace: seconds (median of runs) and peak memory.

Run:  python benchmarks/trace_load.py [--rows 1000000] [--runs 5]

Writes the traces once into a temporary folder (canonical CSV with numeric timestamps, Azure
CSV with datetimes, Mooncake JSONL with hash ids), then, for each, times ``load_trace`` plus
``busiest_window`` in a fresh interpreter under ``/usr/bin/time -v`` so that the peak resident
memory is the load's own. Also reports the whole child process's wall and user CPU seconds
(interpreter start and imports included); user CPU is the steadier figure on a shared machine.
Targets: 5 s and 1 GB.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

CHILD = """
import sys, time
from tuner.traces import busiest_window, load_trace
began = time.perf_counter()
trace = load_trace(sys.argv[1])
loaded = time.perf_counter()
start_s, window = busiest_window(trace, 60.0)
done = time.perf_counter()
print(len(trace), len(window), loaded - began, done - loaded)
"""


def write_traces(folder: Path, rows: int) -> dict[str, Path]:
    rng = np.random.default_rng(0)
    arrival_s = np.cumsum(rng.exponential(0.01, rows))
    inputs = rng.integers(1, 8000, rows)
    outputs = rng.integers(1, 1000, rows)
    canonical = folder / "canonical.csv"
    lines = (f"{t:.6f},{i},{o}" for t, i, o in zip(arrival_s, inputs, outputs, strict=True))
    canonical.write_text("timestamp,input_tokens,output_tokens\n" + "\n".join(lines) + "\n")
    azure = folder / "azure.csv"
    origin = datetime(2023, 11, 16, 18, 0, tzinfo=UTC).timestamp()
    stamps = (
        datetime.fromtimestamp(origin + t, tz=UTC).strftime("%Y-%m-%d %H:%M:%S.%f") + "0"
        for t in arrival_s
    )
    lines = (f"{s},{i},{o}" for s, i, o in zip(stamps, inputs, outputs, strict=True))
    azure.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\r\n" + "\r\n".join(lines))
    mooncake = folder / "mooncake.jsonl"
    with mooncake.open("w") as out:
        for t, i, o in zip(arrival_s, inputs, outputs, strict=True):
            blocks = list(range(int(i) // 512 + 1))
            record = {"timestamp": int(t * 1000), "input_length": int(i), "output_length": int(o)}
            out.write(json.dumps(record | {"hash_ids": blocks}) + "\n")
    return {"canonical CSV": canonical, "Azure CSV": azure, "Mooncake JSONL": mooncake}


@dataclass(frozen=True)
class Run:
    """One fresh-interpreter run: in-process seconds, and the process as ``time -v`` saw it."""

    load_s: float
    window_s: float
    process_wall_s: float
    user_cpu_s: float
    peak_rss_bytes: int

    @property
    def total_s(self) -> float:
        return self.load_s + self.window_s


def _field(pattern: str, text: str) -> str:
    found = re.search(pattern, text)
    if found is None:
        raise RuntimeError(f"/usr/bin/time -v output lacks {pattern!r}")
    return found[1]


def _wall_s(clock: str) -> float:
    """Seconds of ``time -v``'s ``h:mm:ss`` or ``m:ss.ss`` elapsed clock."""
    seconds = 0.0
    for part in clock.split(":"):
        seconds = seconds * 60 + float(part)
    return seconds


def measure(path: Path) -> Run:
    done = subprocess.run(
        ["/usr/bin/time", "-v", sys.executable, "-c", CHILD, str(path)],
        capture_output=True,
        text=True,
        check=True,
    )
    _, _, load_s, window_s = done.stdout.split()
    return Run(
        load_s=float(load_s),
        window_s=float(window_s),
        process_wall_s=_wall_s(_field(r"Elapsed \(wall clock\) time \(.*\): (\S+)", done.stderr)),
        user_cpu_s=float(_field(r"User time \(seconds\): (\S+)", done.stderr)),
        peak_rss_bytes=int(_field(r"Maximum resident set size \(kbytes\): (\d+)", done.stderr))
        * 1024,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    print(f"command: python benchmarks/trace_load.py --rows {args.rows} --runs {args.runs}")
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    with tempfile.TemporaryDirectory() as tmp:
        for name, path in write_traces(Path(tmp), args.rows).items():
            runs = [measure(path) for _ in range(args.runs)]
            load_s = statistics.median(r.load_s for r in runs)
            window_s = statistics.median(r.window_s for r in runs)
            total_s = statistics.median(r.total_s for r in runs)
            process_s = statistics.median(r.process_wall_s for r in runs)
            user_s = statistics.median(r.user_cpu_s for r in runs)
            peak = max(r.peak_rss_bytes for r in runs)
            size_mb = path.stat().st_size / 1e6
            verdict = "ok" if total_s <= 5 and peak <= 1 << 30 else "OVER TARGET"
            print(
                f"{name:<15} {args.rows} rows, {size_mb:.0f} MB: load {load_s:.2f} s + "
                f"busiest window {window_s:.3f} s = {total_s:.2f} s (median of {args.runs}; "
                f"whole process {process_s:.2f} s wall, {user_s:.2f} s user CPU), "
                f"peak RSS {peak / 2**20:.0f} MiB  [{verdict}]"
            )
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
