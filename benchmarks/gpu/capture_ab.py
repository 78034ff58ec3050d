"""vLLM's default CUDA-graph capture range against a pinned one, alternated, at two loads.

    python benchmarks/gpu/capture_ab.py --spec benchmarks/gpu/studies/capture.yaml \
        --trace benchmarks/gpu/traces/story-12rps.csv --out ab/ --seqs 16 32 --runs 2

For each run, each max-num-seqs and each arm in turn (default, pinned: alternated, so drift
of the machine falls on both arms alike), one engine is started from the spec's engine
arguments plus ``max-num-seqs`` (and ``compilation-config.max_cudagraph_capture_size`` for the
pinned arm), warmed with the spec's ``warmup_requests``, then measured for ``--window-s`` at
each of ``--time-scales`` (1: the trace's busiest window at its rate; 0.5: the busiest window
twice as long, replayed at twice the rate). One line of
JSON per engine goes to ``OUT/ab.jsonl`` as it ends; a rerun skips what is there, so a lost
machine loses one engine, not the series. Engines are forked by tuner's zygote launcher.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from tuner.engine.launchers import EngineFailed, ZygoteLauncher
from tuner.engine.process import Engine
from tuner.flags import MAX_CAPTURE_SIZE
from tuner.load.http import ReplaySettings
from tuner.load.metrics import replay_figures
from tuner.load.open_loop import replay_in_process
from tuner.study.measure.prepare import model_of, write_dummy_model
from tuner.study.plan.space import PINNED_CAPTURE_SIZE
from tuner.study.plan.spec import load_spec
from tuner.traces.formats import load_trace
from tuner.traces.workload import build_workload

KEPT = (
    "ttft_p50_s",
    "ttft_p95_s",
    "ttft_p99_s",
    "tpot_p50_s",
    "tpot_p95_s",
    "e2e_p50_s",
    "e2e_p95_s",
    "throughput_req_per_s",
    "error_rate",
    "client_lag_p99_s",
    "running_peak",
)


def done_keys(path: Path) -> set[tuple[int, int, str]]:
    if not path.exists():
        return set()
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {(r["run"], r["max_num_seqs"], r["arm"]) for r in rows}


def summary(path: Path) -> list[str]:
    """Median over runs of TTFT and TPOT p50/p95, per max-num-seqs, load and arm."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    groups: dict[tuple[int, float, str], list[dict[str, float]]] = {}
    for row in rows:
        for load in row.get("loads", []):
            key = (row["max_num_seqs"], load["time_scale"], row["arm"])
            groups.setdefault(key, []).append(load["metrics"])
    lines = ["seqs scale arm      n  ttft_p50 ttft_p95 tpot_p50 tpot_p95 (ms, median of runs)"]
    for (seqs, scale, arm), found in sorted(groups.items()):
        medians = [
            1000 * statistics.median(m[k] for m in found)
            for k in ("ttft_p50_s", "ttft_p95_s", "tpot_p50_s", "tpot_p95_s")
        ]
        lines.append(
            f"{seqs:>4} {scale:>5} {arm:<8} {len(found)} " + " ".join(f"{v:>8.1f}" for v in medians)
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", type=Path, required=True)
    parser.add_argument("--trace", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seqs", type=int, nargs="+", default=[16, 32])
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--pinned", type=int, default=PINNED_CAPTURE_SIZE)
    parser.add_argument("--window-s", type=float, default=20.0)
    parser.add_argument("--time-scales", type=float, nargs="+", default=[1.0, 0.5])
    args = parser.parse_args(argv)

    spec = load_spec(args.spec)
    write_dummy_model(spec)
    info = model_of(spec)
    trace = load_trace(args.trace)
    # Each load replays for --window-s: the busiest window_s / scale seconds of the trace.
    loads = [
        build_workload(trace, args.window_s / s, s, info.max_model_len) for s in args.time_scales
    ]
    settings = ReplaySettings(
        model=str(spec.engine_args.get("served-model-name", spec.model)),
        vocab_size=info.vocab_size,
        seed=spec.seed,
    )
    warmup = loads[0].trace.requests()[: spec.warmup_requests]
    args.out.mkdir(parents=True, exist_ok=True)
    results = args.out / "ab.jsonl"
    done = done_keys(results)
    launcher = ZygoteLauncher(log=args.out / "launcher.log")
    arms = {"default": {}, "pinned": {MAX_CAPTURE_SIZE: args.pinned}}
    try:
        for run, seqs, arm in itertools.product(range(args.runs), args.seqs, arms):
            if (run, seqs, arm) in done:
                continue
            engine_args = {**spec.engine_args, "max-num-seqs": seqs, **arms[arm]}
            workdir = args.out / f"r{run}-s{seqs}-{arm}"
            row = measure(
                spec.model, engine_args, launcher, warmup, loads, settings, workdir,
                spec.health_timeout_s,
            )  # fmt: skip
            row |= {"run": run, "max_num_seqs": seqs, "arm": arm}
            with results.open("a") as out:
                out.write(json.dumps(row) + "\n")
            print(describe(row), flush=True)
    finally:
        launcher.close()
    print("\n".join(summary(results)))
    return 0


def describe(row: dict[str, Any]) -> str:
    shown = [
        f"x{ld['time_scale']:g} ttft p50 {ld['metrics']['ttft_p50_s'] * 1000:.1f} ms "
        f"tpot p50 {ld['metrics']['tpot_p50_s'] * 1000:.2f} ms"
        for ld in row.get("loads", [])
    ]
    text = (
        f"run {row['run']} seqs {row['max_num_seqs']} {row['arm']}: "
        f"start {row.get('engine_healthy_s', 0):.1f} s, hit {row.get('compile_cache_hit')}; "
    )
    return text + "; ".join(shown) + (f" FAILED: {row['failed']}" if "failed" in row else "")


def measure(
    model: str,
    engine_args: dict[str, Any],
    launcher: ZygoteLauncher,
    warmup: list[Any],
    loads: list[Any],
    settings: ReplaySettings,
    workdir: Path,
    health_timeout_s: float,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """One engine: its start, compile facts, and each load's figures."""
    engine = Engine(model, engine_args, workdir, launcher=launcher, env=env or {})
    row: dict[str, Any] = {"engine_args": engine_args}
    try:
        engine.start()
        row["engine_healthy_s"] = engine.wait_healthy(health_timeout_s)
        row["startup"] = engine.times.startup
        row |= engine.compile_cache()
        if warmup:
            replay_in_process(engine.base_url, warmup, settings)
        row["loads"] = []
        for load in loads:
            began = time.monotonic()
            figures = replay_figures(
                replay_in_process(engine.base_url, load.trace.requests(), settings)
            )
            row["loads"].append(
                {
                    "time_scale": load.time_scale,
                    "offered_req_per_s": load.offered_req_per_s,
                    "window_s": time.monotonic() - began,
                    "metrics": {k: figures[k] for k in KEPT if k in figures},
                }
            )
    except EngineFailed as exc:
        row["failed"] = exc.reason
        row["log_tail"] = exc.log_tail
    finally:
        engine.stop()
    return row


if __name__ == "__main__":
    sys.exit(main())
