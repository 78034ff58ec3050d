"""The founding story's workload as a canonical trace: Poisson arrivals, uniform lengths.

Writes ``timestamp,input_tokens,output_tokens`` (timestamps in seconds from 0). Seeded, so the
same arguments always give the same file, byte for byte:

    python benchmarks/gpu/synth_trace.py --rate 12 --duration-s 120 --seed 0 -o story.csv
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np


def synth(
    rate_per_s: float,
    duration_s: float,
    min_tokens: int,
    max_tokens: int,
    seed: int,
) -> list[tuple[float, int, int]]:
    """Rows ``(arrival_s, input_tokens, output_tokens)`` with exponential gaps of mean 1/rate."""
    rng = np.random.default_rng(seed)
    rows: list[tuple[float, int, int]] = []
    t = 0.0
    while True:
        if rows:
            t += float(rng.exponential(1.0 / rate_per_s))
        if t >= duration_s:
            return rows
        n_in, n_out = rng.integers(min_tokens, max_tokens + 1, size=2)
        rows.append((t, int(n_in), int(n_out)))


def to_csv(rows: list[tuple[float, int, int]]) -> str:
    lines = ["timestamp,input_tokens,output_tokens"]
    lines += [f"{t:.6f},{n_in},{n_out}" for t, n_in, n_out in rows]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=12.0, help="mean arrivals per second")
    parser.add_argument("--duration-s", type=float, default=120.0)
    parser.add_argument("--min-tokens", type=int, default=10)
    parser.add_argument("--max-tokens", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("-o", "--output", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.rate <= 0 or args.duration_s <= 0 or not 1 <= args.min_tokens <= args.max_tokens:
        parser.error("need rate > 0, duration > 0 and 1 <= min-tokens <= max-tokens")
    rows = synth(args.rate, args.duration_s, args.min_tokens, args.max_tokens, args.seed)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(to_csv(rows))
    print(f"wrote {len(rows)} requests over {args.duration_s:g} s to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
