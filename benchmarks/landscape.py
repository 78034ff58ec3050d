"""The landscape a study searches: one engine argument stepped over values, all else fixed.

By default steps max-num-seqs 1, 2, 4, 8, 16, 32 on the quick-start workload (the demo study's
model, window and time scale), the founding story's manual procedure, and prints what each
value measured: TTFT, TPOT, end-to-end latency, throughput and the peak of vLLM's queue. On the
CPU demo it shows that small values queue, which is what gives a study something to find.

    python benchmarks/landscape.py
    python benchmarks/landscape.py --spec studies/demo.yaml --name max-num-seqs --values 1,4,16
    python benchmarks/landscape.py --values default,1,2,4,8,32 --time-scale 20 --repeats 2

The value ``default`` leaves the argument out (vLLM's default). With ``--repeats``, the values
are measured in turn, round after round, so a drift of the machine hits every value alike.
"""

from __future__ import annotations

import argparse
import itertools
import tempfile
import time
from pathlib import Path

import yaml

from tuner.engine import ProcessLauncher, write_model
from tuner.load import ReplaySettings
from tuner.study import Criteria, TrialSetup, load_spec, run_trial
from tuner.traces import build_workload, load_trace, model_info

COLUMNS = (
    ("TTFT p50 ms", "ttft_p50_s", 1000),
    ("TTFT p95 ms", "ttft_p95_s", 1000),
    ("TPOT p95 ms", "tpot_p95_s", 1000),
    ("e2e p99 s", "e2e_p99_s", 1),
    ("req/s", "throughput_req_per_s", 1),
    ("queue peak", "waiting_peak", 1),
    ("running peak", "running_peak", 1),
    ("lag max s", "client_lag_max_s", 1),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", type=Path, default=Path("studies/demo.yaml"))
    parser.add_argument("--trace", type=Path, default=Path("traces/azure-conv-peak.csv"))
    parser.add_argument("--name", default="max-num-seqs")
    parser.add_argument("--values", default="1,2,4,8,16,32")
    parser.add_argument("--time-scale", type=float, help="default: the spec's")
    parser.add_argument("--window-s", type=float, help="default: the spec's")
    parser.add_argument("--repeats", type=int, default=1, help="rounds over the values")
    options = parser.parse_args()

    spec = load_spec(options.spec)
    model = spec.model
    if spec.dummy_model:
        model = str(
            write_model(Path(tempfile.mkdtemp(prefix="landscape-")) / "m", spec.dummy_model)
        )
    max_len = spec.engine_args.get("max-model-len")
    info = model_info(model, int(max_len) if max_len else None)
    time_scale = options.time_scale or spec.time_scale
    if not isinstance(time_scale, float | int):
        # A calibrated spec (time_scale: auto) replays at a rate measured on the machine: give
        # the time scale the study calibrated (its output's "time scale X") to replay the same.
        parser.error(f"{options.spec} calibrates its time scale: give --time-scale")
    workload = build_workload(
        load_trace(options.trace),
        options.window_s or spec.window_s,
        float(time_scale),
        info.max_model_len,
    )
    values = [yaml.safe_load(v) for v in options.values.split(",")]
    print(f"{options.spec}: {workload.describe()}")
    print(f"fixed: {dict(spec.engine_args) | dict(spec.baseline)}")
    setup = TrialSetup(
        model=model,
        requests=workload.trace.requests(),
        replay=ReplaySettings(model=model, vocab_size=info.vocab_size, seed=spec.seed),
        criteria=Criteria.of(spec),
        launcher=ProcessLauncher(),
    )
    work = Path(tempfile.mkdtemp(prefix="landscape-runs-"))
    rows = []
    began = time.monotonic()
    try:
        for round_, value in itertools.product(range(options.repeats), values):
            args = {**spec.engine_args, **spec.baseline}
            if value != "default":
                args[options.name] = value
            outcome = run_trial(args, setup, work / f"{options.name}-{value}-{round_}")
            rows.append((value, outcome))
            ttft_s = outcome.metrics.get("ttft_p95_s", float("nan"))
            print(
                f"{options.name}={value}: TTFT p95 {ttft_s * 1000:.0f} ms; "
                f"{outcome.reason or 'meets every SLO'}",
                flush=True,
            )
    finally:
        setup.launcher.close()
    print(f"\n{options.name:>14}" + "".join(f"{c[0]:>13}" for c in COLUMNS))
    for value, outcome in sorted(rows, key=lambda row: values.index(row[0])):
        cells = []
        for _, key, scale in COLUMNS:
            v = outcome.metrics.get(key)
            cells.append(f"{v * scale:13.1f}" if v is not None else f"{'n/a':>13}")
        print(f"{value!s:>14}" + "".join(cells) + ("" if outcome.feasible else "  (misses SLO)"))
    rerun = " ".join(
        f"--{k.replace('_', '-')} {v}" for k, v in vars(options).items() if v is not None
    )
    print(f"\ntook {time.monotonic() - began:.0f} s; rerun: python benchmarks/landscape.py {rerun}")


if __name__ == "__main__":
    main()
