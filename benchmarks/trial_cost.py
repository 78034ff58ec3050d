"""Where a trial's time goes, with a fresh interpreter per server and with tuner's zygote.

Runs one engine configuration ``--repeats`` times with each launcher, alternating
(process, zygote, process, zygote, ...) so that drift on a shared machine hits both alike,
and prints for each: engine start (and its phases), window, shutdown, the share of the
trial that was not measurement, and the measured latencies, so that the two can be seen to
measure the same. The zygote's first start includes its one-off import of vLLM; later starts
are reported apart.

    python benchmarks/trial_cost.py --repeats 3
    python benchmarks/trial_cost.py --shape qwen2.5-3b --arg enforce-eager=false ...   # on a GPU
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from tuner.engine import Launcher, ProcessLauncher, ZygoteLauncher, write_model
from tuner.load import ReplaySettings
from tuner.study import Criteria, TrialOutcome, TrialSetup, run_trial
from tuner.traces import build_workload, load_trace, model_info

TIMINGS = (
    "engine_healthy_s",
    "startup_server_start_s",
    "startup_engine_spawn_s",
    "startup_engine_ready_s",
    "startup_model_load_s",
    "startup_torch_compile_s",
    "startup_cuda_graph_s",
    "window_s",
    "engine_stop_s",
    "trial_s",
)
METRICS = (
    "ttft_p50_s",
    "ttft_p95_s",
    "tpot_p50_s",
    "tpot_p95_s",
    "e2e_p99_s",
    "throughput_output_tokens_per_s",
)


def parse_arg(text: str) -> tuple[str, Any]:
    name, _, value = text.partition("=")
    return name, yaml.safe_load(value)


def median(values: list[float]) -> str:
    return f"{statistics.median(values):8.2f}" if values else "     n/a"


def spread(values: list[float]) -> str:
    return f"[{min(values):.2f}-{max(values):.2f}]" if values else ""


def parse_variant(text: str) -> tuple[str, str, dict[str, str]]:
    """``NAME=LAUNCHER[,KEY=VALUE...]``: a launcher and the environment its servers get."""
    name, _, rest = text.partition("=")
    launcher, *pairs = rest.split(",")
    if launcher not in ("process", "zygote") or not name:
        raise argparse.ArgumentTypeError(f"{text!r}: want NAME=process|zygote[,KEY=VALUE...]")
    env = dict(pair.split("=", 1) for pair in pairs)
    return name, launcher, env


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default="traces/azure-conv-peak.csv")
    parser.add_argument("--window-s", type=float, default=10.0)
    parser.add_argument("--time-scale", type=float, default=6.0)
    parser.add_argument("--shape", default="cpu-demo")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--arg", action="append", default=[], type=parse_arg)
    parser.add_argument(
        "--variant",
        action="append",
        type=parse_variant,
        help="NAME=process|zygote[,KEY=VALUE...] (default: process=process zygote=zygote); "
        "zygote variants share one launcher",
    )
    parser.add_argument("--json", type=Path, help="also write every trial's figures here")
    options = parser.parse_args()
    variants = options.variant or [("process", "process", {}), ("zygote", "zygote", {})]

    args: dict[str, Any] = {
        "load-format": "dummy",
        "max-model-len": 4096,
        "enforce-eager": True,
        "gpu-memory-utilization": 0.2,
        "max-num-seqs": 16,
    }
    args.update(dict(options.arg))
    work = Path(tempfile.mkdtemp(prefix="trial-cost-"))
    model = str(write_model(work / "model", options.shape))
    info = model_info(model, args.get("max-model-len"))
    workload = build_workload(
        load_trace(options.trace), options.window_s, options.time_scale, info.max_model_len
    )
    print(f"config: {args}")
    print(f"window: {workload.describe()}")
    print("variants: " + "; ".join(f"{n} = {kind} {env or ''}" for n, kind, env in variants))

    zygote = ZygoteLauncher()
    launchers: dict[str, Launcher] = {
        name: zygote if kind == "zygote" else ProcessLauncher() for name, kind, _ in variants
    }
    outcomes: dict[str, list[TrialOutcome]] = {name: [] for name, _, _ in variants}
    began = time.monotonic()
    try:
        for repeat in range(options.repeats):
            for name, _, env in variants:
                setup = TrialSetup(
                    model=model,
                    requests=workload.trace.requests(),
                    replay=ReplaySettings(model=model, vocab_size=info.vocab_size),
                    criteria=Criteria({"ttft_p95_s": 1e9}, {"ttft_p95_s": 1.0}, 1.0),
                    launcher=launchers[name],
                    env=env,
                )
                outcome = run_trial(args, setup, work / f"{name}-{repeat}")
                outcomes[name].append(outcome)
                t = outcome.timings
                print(
                    f"repeat {repeat} {name:8} start {t.get('engine_healthy_s', 0):6.1f} s  "
                    f"window {t.get('window_s', 0):5.1f} s  reason {outcome.reason}",
                    flush=True,
                )
    finally:
        zygote.close()

    # The first engine of a run pays for cold caches (and the zygote's one-off import): the
    # "later" columns leave out repeat 0.
    groups = {name: group for name, group in outcomes.items()}
    if options.repeats > 1:
        groups |= {f"{name} later": group[1:] for name, group in outcomes.items()}
    print(f"\nmedian [min-max] over {options.repeats} repeats; 'later' leaves out repeat 0")
    print(f"{'':34}" + "".join(f"{g:>24}" for g in groups))
    for key in TIMINGS + METRICS:
        row = f"{key:34}"
        for group in groups.values():
            values = [
                o.timings[key] if key in o.timings else o.metrics[key]
                for o in group
                if key in o.timings or key in o.metrics
            ]
            row += f"{median(values)} {spread(values):>15}"
        print(row)
    for name, group in groups.items():
        total = sum(o.timings.get("trial_s", 0) for o in group)
        window = sum(o.timings.get("window_s", 0) for o in group)
        if total:
            print(f"overhead ({name}): {1 - window / total:.0%} of trial time not measurement")
    print(
        f"\ntook {time.monotonic() - began:.0f} s; rerun: python benchmarks/trial_cost.py "
        f"--repeats {options.repeats} --window-s {options.window_s:g} "
        f"--time-scale {options.time_scale:g} --shape {options.shape} "
        + " ".join(f"--arg {k}={v}" for k, v in options.arg)
        + " ".join(
            f" --variant {n}={kind}" + "".join(f",{k}={v}" for k, v in env.items())
            for n, kind, env in (options.variant or [])
        )
    )
    if options.json:
        options.json.write_text(
            json.dumps(
                {
                    n: [{"timings": o.timings, "metrics": o.metrics} for o in g]
                    for n, g in outcomes.items()
                },
                indent=1,
            )
        )


if __name__ == "__main__":
    main()
