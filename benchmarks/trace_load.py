"""Loading and windowing a 1,000,000-row trace: seconds (median of runs) and peak memory.

Run:  python benchmarks/trace_load.py [--rows 1000000] [--runs 5]

Writes the traces once into a temporary folder (canonical CSV with numeric timestamps, Azure
CSV with datetimes, Mooncake JSONL with hash ids), then, for each, times ``load_trace`` plus
``busiest_window`` in a fresh interpreter under ``/usr/bin/time -v`` so that the peak resident
memory is the load's own. Targets: 5 s and 1 GB.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

CHILD = """
import sys, time
from tuner.formats import load_trace
from tuner.trace import busiest_window
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


def measure(path: Path) -> tuple[float, float, float, int]:
    """``(load s, window s, total wall s, peak RSS bytes)`` of one fresh-interpreter run."""
    done = subprocess.run(
        ["/usr/bin/time", "-v", sys.executable, "-c", CHILD, str(path)],
        capture_output=True,
        text=True,
        check=True,
    )
    _, _, load_s, window_s = done.stdout.split()
    peak_kb = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", done.stderr)[1])  # type: ignore[index]
    return float(load_s), float(window_s), float(load_s) + float(window_s), peak_kb * 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    print(f"command: python benchmarks/trace_load.py --rows {args.rows} --runs {args.runs}")
    with tempfile.TemporaryDirectory() as tmp:
        for name, path in write_traces(Path(tmp), args.rows).items():
            runs = [measure(path) for _ in range(args.runs)]
            load_s = statistics.median(r[0] for r in runs)
            window_s = statistics.median(r[1] for r in runs)
            total_s = statistics.median(r[2] for r in runs)
            peak = max(r[3] for r in runs)
            size_mb = path.stat().st_size / 1e6
            verdict = "ok" if total_s <= 5 and peak <= 1 << 30 else "OVER TARGET"
            print(
                f"{name:<15} {args.rows} rows, {size_mb:.0f} MB: load {load_s:.2f} s + "
                f"busiest window {window_s:.3f} s = {total_s:.2f} s (median of {args.runs}), "
                f"peak RSS {peak / 2**20:.0f} MiB  [{verdict}]"
            )


if __name__ == "__main__":
    main()
