"""The landscape a study searches: one engine argument stepped over values, all else fixed.

By default steps max-num-seqs 1, 2, 4, 8, 16, 32 on the quick-start workload (the demo study's
model, window and time scale), the founding story's manual procedure, and prints what each
value measured: TTFT, TPOT, end-to-end latency, throughput and the peak of vLLM's queue. On the
CPU demo it shows that small values queue, which is what gives a study something to find.

    python benchmarks/landscape.py
    python benchmarks/landscape.py --spec studies/demo.yaml --name max-num-seqs --values 1,4,16
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import yaml

from tuner.dummy_model import write_model
from tuner.engine import ProcessLauncher
from tuner.formats import load_trace
from tuner.replay import ReplaySettings
from tuner.spec import load_spec
from tuner.trial import Objective, TrialSetup, run_trial
from tuner.workload import build_workload, model_info

COLUMNS = (
    ("TTFT p50 ms", "ttft_p50_s", 1000),
    ("TTFT p95 ms", "ttft_p95_s", 1000),
    ("TPOT p95 ms", "tpot_p95_s", 1000),
    ("e2e p99 s", "e2e_p99_s", 1),
    ("req/s", "throughput_req_per_s", 1),
    ("queue peak", "waiting_peak", 1),
    ("running peak", "running_peak", 1),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", type=Path, default=Path("studies/demo.yaml"))
    parser.add_argument("--trace", type=Path, default=Path("traces/azure-conv-peak.csv"))
    parser.add_argument("--name", default="max-num-seqs")
    parser.add_argument("--values", default="1,2,4,8,16,32")
    options = parser.parse_args()

    spec = load_spec(options.spec)
    model = spec.model
    if spec.dummy_model:
        model = str(
            write_model(Path(tempfile.mkdtemp(prefix="landscape-")) / "m", spec.dummy_model)
        )
    max_len = spec.engine_args.get("max-model-len")
    info = model_info(model, int(max_len) if max_len else None)
    workload = build_workload(
        load_trace(options.trace), spec.window_s, spec.time_scale, info.max_model_len
    )
    values = [yaml.safe_load(v) for v in options.values.split(",")]
    print(f"{options.spec}: {workload.describe()}")
    print(f"fixed: {dict(spec.engine_args) | dict(spec.baseline)}")
    launcher = ProcessLauncher()
    work = Path(tempfile.mkdtemp(prefix="landscape-runs-"))
    rows = []
    began = time.monotonic()
    try:
        for value in values:
            args = {**spec.engine_args, **spec.baseline, options.name: value}
            setup = TrialSetup(
                model=model,
                requests=workload.trace.requests(),
                replay=ReplaySettings(model=model, vocab_size=info.vocab_size, seed=spec.seed),
                objective=Objective(spec.slos, spec.weights, spec.max_error_rate),
                launcher=launcher,
            )
            outcome = run_trial(args, setup, work / f"{options.name}-{value}")
            rows.append((value, outcome))
            print(f"{options.name}={value}: {outcome.reason or 'meets every SLO'}", flush=True)
    finally:
        launcher.close()
    print(f"\n{options.name:>14}" + "".join(f"{c[0]:>13}" for c in COLUMNS))
    for value, outcome in rows:
        cells = []
        for _, key, scale in COLUMNS:
            v = outcome.metrics.get(key)
            cells.append(f"{v * scale:13.1f}" if v is not None else f"{'n/a':>13}")
        print(f"{value!s:>14}" + "".join(cells) + ("" if outcome.feasible else "  (misses SLO)"))
    print(
        f"\ntook {time.monotonic() - began:.0f} s; rerun: python benchmarks/landscape.py "
        f"--spec {options.spec} --name {options.name} --values {options.values}"
    )


if __name__ == "__main__":
    main()
