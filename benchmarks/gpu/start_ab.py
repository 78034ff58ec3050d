"""Engine starts under start-up levers, alternated: what each lever saves, and what it changes.

    python benchmarks/gpu/start_ab.py --spec benchmarks/gpu/studies/story.yaml \
        --trace benchmarks/gpu/traces/story-12rps.csv --out starts/ --runs 3 --new-key \
        --arm 'vllm={}' --arm 'shared-triton={"env": {"TUNER_TRITON_CACHE_DIR": "{out}/triton"}}'

An arm is ``NAME=JSON``: ``args``, engine arguments over the spec's (pinned capture range
included: ``compilation-config.max_cudagraph_capture_size`` 512 unless the arm lists its
``compilation-config.cudagraph_capture_sizes``), and
``env``, the server's environment (``{out}`` in a value is ``--out``). Each run starts one engine
per arm in turn, so drift of the machine falls on every arm alike. With ``--new-key`` every
start gets a max-num-batched-tokens no other start had (the spec's, else 8192, plus 16 times the
start's index), so vLLM's compile cache misses, as in a study that searches that argument;
without it, an arm's starts after its first reuse its compile. Each engine is warmed with the
spec's ``warmup_requests`` and measured for ``--window-s`` on the trace's busiest window, to
show that a lever leaves latency as it was. Engines are forked by tuner's zygote launcher.

One JSON line per engine goes to ``OUT/starts.jsonl`` as it ends (start-up steps from vLLM's
log, compile facts, latency figures); a rerun skips what is there. At the end, and with
``--report`` alone, a table of medians per arm over runs 1 onward (run 0 also fills caches).
"""

from __future__ import annotations

import argparse
import itertools
import json
import shutil
import statistics
import sys
from pathlib import Path
from typing import Any

from capture_ab import measure

from tuner.engine.launchers import ZygoteLauncher
from tuner.engine.startup import STEPS
from tuner.flags import CAPTURE_SIZES, MAX_CAPTURE_SIZE
from tuner.load.http import ReplaySettings
from tuner.study.measure.prepare import model_of, write_dummy_model
from tuner.study.plan.space import PINNED_CAPTURE_SIZE
from tuner.study.plan.spec import load_spec
from tuner.traces.formats import load_trace
from tuner.traces.workload import build_workload

SHOWN = ("ttft_p50_s", "ttft_p95_s", "tpot_p50_s", "tpot_p95_s")
BATCHED = "max-num-batched-tokens"


def parse_arm(text: str) -> tuple[str, dict[str, Any]]:
    name, sep, body = text.partition("=")
    arm = json.loads(body) if sep else {}
    if not name or not isinstance(arm, dict) or set(arm) - {"args", "env"}:
        raise argparse.ArgumentTypeError(f'{text!r}: NAME={{"args": {{...}}, "env": {{...}}}}')
    return name, arm


def rows_of(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def median_cell(values: list[float]) -> str:
    return f"{statistics.median(values):.1f}" if values else "-"


def report(rows: list[dict[str, Any]]) -> list[str]:
    """Per arm, medians over runs 1 onward (run 0 where there is nothing else)."""
    arms = list(dict.fromkeys(r["arm"] for r in rows))
    seen = {k for r in rows for k in r.get("startup", {})}
    steps = [f"step_{name}_s" for name, _ in STEPS if f"step_{name}_s" in seen]
    lines = [
        "| arm | n | healthy s | " + " | ".join(s[5:-2] for s in steps) + " | "
        + " | ".join(f"{k[:-2]} ms" for k in SHOWN) + " | compile hit |",
        "|---|" + "---|" * (3 + len(steps) + len(SHOWN)),
    ]  # fmt: skip
    for arm in arms:
        mine = [r for r in rows if r["arm"] == arm]
        served = [r for r in mine if "failed" not in r]
        later = [r for r in served if r["run"] > 0] or served
        if not later:
            lines.append(f"| {arm} | 0 | failed: {str(mine[0]['failed'])[:80]} |")
            continue
        startup = [r["startup"] for r in later]
        loads = [r["loads"][0]["metrics"] for r in later if r.get("loads")]
        cells = [median_cell([s["healthy_s"] for s in startup])]
        cells += [median_cell([s[k] for s in startup if k in s]) for k in steps]
        cells += [median_cell([1000 * m[k] for m in loads if k in m]) for k in SHOWN]
        hits = [r.get("compile_cache_hit") for r in later]
        lines.append(f"| {arm} | {len(later)} | " + " | ".join(cells) + f" | {hits} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", type=Path, required=True)
    parser.add_argument("--trace", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--arm", type=parse_arm, action="append", default=[])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--new-key", action="store_true")
    parser.add_argument("--window-s", type=float, default=20.0)
    parser.add_argument("--report", action="store_true", help="print the table and exit")
    args = parser.parse_args(argv)
    results = args.out / "starts.jsonl"
    if args.report:
        print("\n".join(report(rows_of(results))))
        return 0
    arms = dict(args.arm) or {"vllm": {}}

    spec = load_spec(args.spec)
    write_dummy_model(spec)
    info = model_of(spec)
    load = build_workload(load_trace(args.trace), args.window_s, 1.0, info.max_model_len)
    settings = ReplaySettings(
        model=str(spec.engine_args.get("served-model-name", spec.model)),
        vocab_size=info.vocab_size,
        seed=spec.seed,
    )
    warmup = load.trace.requests()[: spec.warmup_requests]
    args.out.mkdir(parents=True, exist_ok=True)
    done = {(r["run"], r["arm"]) for r in rows_of(results)}
    base_batched = int(spec.engine_args.get(BATCHED, 8192))
    launcher = ZygoteLauncher(log=args.out / "launcher.log")
    try:
        for index, (run, name) in enumerate(itertools.product(range(args.runs), arms)):
            if (run, name) in done:
                continue
            arm = arms[name]
            engine_args = {**spec.engine_args, MAX_CAPTURE_SIZE: PINNED_CAPTURE_SIZE}
            if args.new_key:
                engine_args[BATCHED] = base_batched + 16 * index
            engine_args |= arm.get("args", {})
            if CAPTURE_SIZES in engine_args:  # the arm lists its sizes: no largest size too
                engine_args.pop(MAX_CAPTURE_SIZE, None)
            env = {k: str(v).replace("{out}", str(args.out.resolve())) for k, v in
                   arm.get("env", {}).items()}  # fmt: skip
            workdir = args.out / f"r{run}-{name}"
            # An engine cut off by an earlier call left its log: its steps must not be read
            # into this start's (run 2 of `vllm` in benchmarks/results/h100-start-steps.md read 43 s
            # of engine process so).
            shutil.rmtree(workdir, ignore_errors=True)
            row = measure(
                spec.model, engine_args, launcher, warmup, [load], settings,
                workdir, spec.health_timeout_s, env,
            )  # fmt: skip
            row |= {"run": run, "arm": name, "env": env}
            with results.open("a") as out:
                out.write(json.dumps(row) + "\n")
            steps = {k[5:-2]: round(v) for k, v in row.get("startup", {}).items() if "step_" in k}
            print(
                f"run {run} {name}: start {row.get('engine_healthy_s', 0):.1f} s, "
                f"hit {row.get('compile_cache_hit')}, steps {steps}"
                + (f" FAILED: {row['failed']}" if "failed" in row else ""),
                flush=True,
            )
    finally:
        launcher.close()
    print("\n".join(report(rows_of(results))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
