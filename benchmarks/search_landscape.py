"""The incumbent search against TPE, on a landscape measured exhaustively on vLLM's CPU build.

Part 1, the landscape (``--measure``): every configuration of a grid, each on a fresh engine
started and warmed up as a trial is, and its capacity found by tuner's capacity search (the
spec's SLOs, ``--window-s`` seconds a rate). vLLM's defaults are measured too. The grid is the
search space below: max-num-seqs at the powers of two from 1 to 32 (vLLM's CPU default, 128,
lies above) and max-num-batched-tokens at 512, 2048 and 8192 (vLLM's CPU default is 2048).
Written to ``--table`` (JSON), one line printed per configuration as it is measured.

Part 2, the searches on that table (no engine): each search proposes configurations and is told
the table's capacity of each, as a study's trials would be. Counted: trials, vLLM's defaults
(trial 0) included, until one within 5 % of the grid's best, and the best after 12 trials.

- incumbent: ``tuner.study.trials.incumbent.next_point`` with vLLM's defaults as the dimensions'
  defaults, TPE after it has nothing left to propose (deterministic: one run);
- tpe: Optuna's TPE sampler (multivariate, as ``tuner.study.trials.search.open_study`` builds
  it) over the same dimensions, drawn by ``tuner.study.trials.search.suggest``, ``--seeds`` seeds.

A configuration outside the table (TPE draws max-num-seqs as an integer on a log scale) reads the
capacity of the nearest measured max-num-seqs (log distance). The table is one measurement per
configuration: on a shared 2-core machine a re-measurement differs by 10 to 20 %, so "within
5 %" is of this table, not of the machine.

    flock /tmp/cpu.lock python benchmarks/search_landscape.py --measure    # about 35 min
    python benchmarks/search_landscape.py                                  # seconds, from the table
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import optuna

from tuner.engine import Engine, write_model
from tuner.load import ReplaySettings, replay_in_process
from tuner.study import (
    KV_ARGUMENTS,
    MAX_BATCHED_TOKENS,
    MAX_NUM_SEQS,
    CapacitySettings,
    Criteria,
    Dimension,
    StartHint,
    Taken,
    levels,
    load_spec,
    measure_capacity,
    next_point,
    suggest,
)
from tuner.traces import build_workload, load_trace, model_info

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
SPACE = (
    Dimension(MAX_NUM_SEQS, "int", 1, 32, log=True, default=128, has_default=True),
    Dimension(
        MAX_BATCHED_TOKENS, "categorical", choices=(512, 2048, 8192), default=2048, has_default=True
    ),
)
DEFAULTS = {d.name: d.default for d in SPACE}
RULES = [(MAX_NUM_SEQS, MAX_BATCHED_TOKENS)]
WITHIN = 0.05
BUDGET = 12


def key(params: Mapping[str, Any]) -> str:
    return json.dumps({d.name: params[d.name] for d in SPACE})


def grid() -> list[dict[str, Any]]:
    points: list[dict[str, Any]] = [{}]  # vLLM's defaults
    for seqs in levels(SPACE[0]):
        for tokens in levels(SPACE[1]):
            if tokens >= seqs:
                points.append({MAX_NUM_SEQS: seqs, MAX_BATCHED_TOKENS: tokens})
    return points


def measure(options: argparse.Namespace) -> None:
    spec = load_spec(options.spec)
    trace = load_trace(options.trace)
    table: dict[str, Any] = {"configurations": {}}
    if options.table.exists():
        table = json.loads(options.table.read_text())
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        model = str(write_model(work / "model", spec.dummy_model or "cpu-tiny"))
        max_len = spec.engine_args.get("max-model-len")
        info = model_info(model, int(max_len) if max_len else None)
        workload = build_workload(trace, spec.window_s, 1.0, info.max_model_len)
        requests = workload.trace.requests()
        settings = CapacitySettings(
            requests=requests,
            period_s=workload.replay_s,
            probe_s=options.window_s,
            resolution=options.resolution,
            max_probes=options.max_windows,
            # The spec's (the demo's 1 s, as tuner run uses on vLLM's CPU build): with the GPU
            # default, 5 ms, tuner's client on two shared cores "fell behind" at vLLM's
            # defaults' third rate and the search stopped there.
            client_tolerance_s=spec.client_tolerance_s,
        )
        replay_settings = ReplaySettings(
            model=model, vocab_size=info.vocab_size, block_tokens=trace.block_tokens
        )
        # The spec's KV-cache size where it sets one (the demo's kv-cache-memory-bytes), else
        # --share: the same for every configuration.
        sized = any(name in spec.engine_args for name in KV_ARGUMENTS)
        kv_size = {} if sized else {"gpu-memory-utilization": options.share}
        table["setup"] = {
            "spec": str(options.spec),
            "trace": str(options.trace),
            "window": workload.describe(),
            "engine_args": dict(spec.engine_args),
            "kv_cache": kv_size or "the spec's",
            "slos": dict(spec.slos),
            "capacity_probe_s": options.window_s,
            "resolution": options.resolution,
            "client_tolerance_s": spec.client_tolerance_s,
        }
        print(f"window: {workload.describe()}; SLOs {dict(spec.slos)}", flush=True)
        hint = None
        criteria = Criteria.of(spec)
        for params in grid():
            name = key({**DEFAULTS, **params}) if params else "defaults"
            if name in table["configurations"]:
                continue
            args = {**spec.engine_args, **kv_size, **params}
            began = time.monotonic()
            engine = Engine(model, args, work / "engine", env={"VLLM_SERVER_DEV_MODE": "1"})
            with engine:
                engine.wait_healthy(spec.health_timeout_s)
                replay_in_process(engine.base_url, requests[:8], replay_settings)
                run = settings if hint is None else _hinted(settings, hint)
                found = measure_capacity(engine.base_url, run, replay_settings, criteria)
            took_s = time.monotonic() - began
            capacity = found.capacity_req_per_s
            hint = capacity or hint
            table["configurations"][name] = {
                "params": params,
                "capacity_req_per_s": capacity,
                "windows": len(found.points),
                "seconds": round(took_s, 1),
                "why_stopped": found.why_stopped,
            }
            options.table.write_text(json.dumps(table, indent=1) + "\n")
            print(
                f"{name:60s} capacity {capacity:7.3f} req/s  {len(found.points)} windows  "
                f"{took_s:4.0f} s  ({found.why_stopped})",
                flush=True,
            )


def _hinted(settings: CapacitySettings, rate: float) -> CapacitySettings:
    """Start from the last configuration's capacity, as a study starts from a neighbour's."""
    return replace(settings, hint=StartHint(rate, repeat=False))


def lookup(table: Mapping[str, Any]) -> Callable[[Mapping[str, Any]], float]:
    measured = {
        name: entry["capacity_req_per_s"]
        for name, entry in table["configurations"].items()
        if name != "defaults"
    }
    seqs_levels = sorted({json.loads(name)[MAX_NUM_SEQS] for name in measured})

    def capacity(params: Mapping[str, Any]) -> float:
        if not params:
            return float(table["configurations"]["defaults"]["capacity_req_per_s"])
        seqs = min(seqs_levels, key=lambda s: abs(math.log(s / params[MAX_NUM_SEQS])))
        return float(measured[key({**params, MAX_NUM_SEQS: seqs})])

    return capacity


def run_incumbent(capacity: Callable[[Mapping[str, Any]], float], trials: int) -> list[float]:
    """Capacities in the order the incumbent search measures them, trial 0 the defaults."""
    taken = [Taken({}, rank=-capacity({}))]
    values = [capacity({})]
    fallback = _tpe(capacity, seed=0, baseline=False)
    while len(values) < trials:
        proposal = next_point(SPACE, taken, DEFAULTS, RULES)
        if proposal is None:
            values.append(next(fallback))
            continue
        value = capacity(proposal.params)
        taken.append(Taken(proposal.params, rank=-value))
        values.append(value)
    return values


def _tpe(capacity: Callable[[Mapping[str, Any]], float], seed: int, baseline: bool = True) -> Any:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sampler = optuna.samplers.TPESampler(seed=seed, multivariate=True)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    if baseline:
        yield capacity({})
    while True:
        trial = study.ask()
        params = suggest(trial, SPACE, {})
        value = capacity(params)
        study.tell(trial, value)
        yield value


def run_tpe(capacity: Callable[[Mapping[str, Any]], float], trials: int, seed: int) -> list[float]:
    draws = _tpe(capacity, seed)
    return [next(draws) for _ in range(trials)]


def trials_to(values: list[float], target: float) -> int | None:
    return next((i + 1 for i, v in enumerate(values) if v >= target), None)


def compare(options: argparse.Namespace) -> None:
    table = json.loads(options.table.read_text())
    capacity = lookup(table)
    measured = table["configurations"]
    best_name = max(measured, key=lambda n: measured[n]["capacity_req_per_s"])
    best = measured[best_name]["capacity_req_per_s"]
    target = (1 - WITHIN) * best
    print(f"table: {options.table} ({len(measured)} configurations; {table['setup']['window']})")
    for name, entry in sorted(measured.items(), key=lambda kv: -kv[1]["capacity_req_per_s"]):
        print(f"  {entry['capacity_req_per_s']:7.3f} req/s  {name}")
    print(f"best {best:.3f} req/s ({best_name}); within {WITHIN:.0%}: {target:.3f} req/s or more")
    horizon = len(measured) * 3
    ours = run_incumbent(capacity, horizon)
    found = trials_to(ours, target)
    print(
        f"incumbent: {found} trials to within {WITHIN:.0%}; best after {BUDGET} trials "
        f"{max(ours[:BUDGET]):.3f} req/s"
    )
    counts, bests, never = [], [], 0
    for seed in range(options.seeds):
        values = run_tpe(capacity, horizon, seed)
        reached = trials_to(values, target)
        if reached is None:
            never += 1
        else:
            counts.append(reached)
        bests.append(max(values[:BUDGET]))
    if counts:
        quartiles = statistics.quantiles(counts, n=4) if len(counts) > 1 else [counts[0]] * 3
        print(
            f"tpe ({options.seeds} seeds): trials to within {WITHIN:.0%} median "
            f"{statistics.median(counts):g} (quartiles {quartiles[0]:g} to {quartiles[2]:g}, "
            f"range {min(counts)} to {max(counts)}); not within {horizon} trials: {never}"
        )
    print(
        f"tpe: best after {BUDGET} trials median {statistics.median(bests):.3f} req/s "
        f"(range {min(bests):.3f} to {max(bests):.3f})"
    )
    print(f"rerun: python benchmarks/search_landscape.py --table {options.table}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--measure", action="store_true", help="measure the table (part 1)")
    parser.add_argument("--spec", type=Path, default=REPO / "studies" / "demo.yaml")
    parser.add_argument("--trace", type=Path, default=REPO / "traces" / "azure-conv-peak.csv")
    parser.add_argument(
        "--table",
        type=Path,
        default=RESULTS / "cpu-search-landscape" / "cpu-search-landscape.json",
    )
    parser.add_argument("--window-s", type=float, default=10.0, help="seconds a rate")
    parser.add_argument("--resolution", type=float, default=0.15)
    parser.add_argument("--max-windows", type=int, default=6)
    parser.add_argument(
        "--share", type=float, default=0.2, help="gpu-memory-utilization, where the spec sizes none"
    )
    parser.add_argument("--seeds", type=int, default=50, help="TPE seeds (part 2)")
    options = parser.parse_args()
    if options.measure:
        measure(options)
    compare(options)


if __name__ == "__main__":
    main()
