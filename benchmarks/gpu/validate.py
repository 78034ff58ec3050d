"""Measure one engine configuration N times on a study's replay window.

    python benchmarks/gpu/validate.py --spec S.yaml --trace T.csv --label best \
        --config configs/story.yaml --repeats 3 --out validate-best.json
    python benchmarks/gpu/validate.py ... --label defaults   # the spec's engine_args only
    python benchmarks/gpu/validate.py ... --label hand-tuned --set max-num-seqs=16 \
        --set max-num-batched-tokens=8192 --set gpu-memory-utilization=0.3

The window is the one ``tuner run`` replays (same spec, same trace: busiest ``window_s``,
clipped, time-scaled; same prompts). By default each repeat starts its own engine, as a study
trial does (``--same-engine`` reuses one engine and warms it once). Writes every repeat's
figures and timings as JSON and prints p50/p95/p99 of TTFT, TPOT and end-to-end latency and
the throughput, per repeat and as median [min, max] over the repeats.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from tuner.engine import Engine, EngineFailed
from tuner.flags import SERVER_ONLY, normalize
from tuner.load import ReplaySettings, replay_figures, replay_in_process
from tuner.study import TimeScale, load_spec, model_of, write_dummy_model
from tuner.traces import build_workload, load_trace

SHOWN = (
    ("ttft_p50_s", 1000, "TTFT p50 ms"),
    ("ttft_p95_s", 1000, "TTFT p95 ms"),
    ("ttft_p99_s", 1000, "TTFT p99 ms"),
    ("tpot_p50_s", 1000, "TPOT p50 ms"),
    ("tpot_p95_s", 1000, "TPOT p95 ms"),
    ("tpot_p99_s", 1000, "TPOT p99 ms"),
    ("e2e_p50_s", 1000, "e2e p50 ms"),
    ("e2e_p95_s", 1000, "e2e p95 ms"),
    ("e2e_p99_s", 1000, "e2e p99 ms"),
    ("throughput_req_per_s", 1, "req/s"),
    ("throughput_output_tokens_per_s", 1, "out tok/s"),
    ("error_rate", 100, "errors %"),
)


def parse_value(text: str) -> Any:
    return yaml.safe_load(text)


def engine_args_from(
    spec_args: dict[str, Any], config: Path | None, overrides: list[str]
) -> dict[str, Any]:
    """The spec's fixed engine args, then a ``--config`` YAML's (less model, host, port)."""
    args = dict(spec_args)
    if config is not None:
        loaded = normalize(yaml.safe_load(config.read_text()) or {})
        args |= {k: v for k, v in loaded.items() if k not in SERVER_ONLY and k != "model"}
    for item in overrides:
        name, _, value = item.partition("=")
        args |= normalize({name: parse_value(value)})
    return args


def measure(
    engine: Engine, requests: list[Any], settings: ReplaySettings
) -> tuple[dict[str, float], float]:
    began = time.monotonic()
    result = replay_in_process(engine.base_url, requests, settings)
    window_s = time.monotonic() - began
    return replay_figures(result), window_s


def summary_rows(label: str, repeats: list[dict[str, Any]]) -> list[str]:
    ok = [r["metrics"] for r in repeats if r.get("metrics")]
    rows = []
    for key, scale, title in SHOWN:
        values = [m[key] * scale for m in ok if key in m]
        if not values:
            continue
        each = " ".join(f"{v:9.1f}" for v in values)
        spread = f"{statistics.median(values):9.1f} [{min(values):.1f}, {max(values):.1f}]"
        rows.append(f"{label:<12} {title:<13} {each}   median {spread}")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", type=Path, required=True)
    parser.add_argument("--trace", type=Path, required=True)
    parser.add_argument("--label", required=True, help="name of the configuration")
    parser.add_argument("--config", type=Path, help="a vllm --config YAML (e.g. tuner's output)")
    parser.add_argument("--set", action="append", default=[], help="NAME=VALUE engine argument")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--same-engine", action="store_true", help="one engine for all repeats")
    parser.add_argument("--workdir", type=Path, default=Path("runs/validate"))
    parser.add_argument("--out", type=Path, help="JSON file of every repeat")
    args = parser.parse_args(argv)

    spec = load_spec(args.spec)
    write_dummy_model(spec)
    info = model_of(spec)
    workload = build_workload(
        load_trace(args.trace),
        spec.window_s,
        TimeScale(spec.time_scale).factor(),
        info.max_model_len,
    )
    requests = workload.trace.requests()
    warmup = requests[: spec.warmup_requests]
    settings = ReplaySettings(
        model=str(spec.engine_args.get("served-model-name", spec.model)),
        vocab_size=info.vocab_size,
        block_tokens=workload.trace.block_tokens,
        seed=spec.seed,
    )
    engine_args = engine_args_from(dict(spec.engine_args), args.config, args.set)
    print(f"{args.label}: {engine_args}; window: {workload.describe()}", flush=True)

    repeats: list[dict[str, Any]] = []
    engine: Engine | None = None
    try:
        for i in range(args.repeats):
            record: dict[str, Any] = {"repeat": i, "timings": {}}
            timings = record["timings"]
            try:
                if engine is None or not args.same_engine:
                    engine = Engine(spec.model, engine_args, args.workdir / f"{args.label}-{i}")
                    engine.start()
                    timings["engine_healthy_s"] = engine.wait_healthy(spec.health_timeout_s)
                    if warmup:
                        began = time.monotonic()
                        replay_in_process(engine.base_url, warmup, settings)
                        timings["warmup_s"] = time.monotonic() - began
                record["metrics"], timings["window_s"] = measure(engine, requests, settings)
            except EngineFailed as exc:
                record["failed"] = exc.reason
                record["log_tail"] = exc.log_tail
                print(f"repeat {i}: {exc.reason}\n{exc.log_tail}", flush=True)
            if not args.same_engine and engine is not None:
                engine.stop()
                timings["engine_stop_s"] = engine.times.stop_s or 0.0
                engine = None
            repeats.append(record)
            m = record.get("metrics", {})
            print(
                f"repeat {i}: "
                + ", ".join(f"{k} {v:.1f}" for k, v in timings.items())
                + (f"; ttft p95 {m['ttft_p95_s'] * 1000:.1f} ms" if "ttft_p95_s" in m else ""),
                flush=True,
            )
    finally:
        if engine is not None:
            engine.stop()
    document = {
        "label": args.label,
        "engine_args": engine_args,
        "model": spec.model,
        "window": workload.describe(),
        "same_engine": args.same_engine,
        "repeats": repeats,
    }
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(document, indent=1) + "\n")
    print("\n".join(summary_rows(args.label, repeats)))
    return 0 if all("metrics" in r for r in repeats) else 1


if __name__ == "__main__":
    sys.exit(main())
