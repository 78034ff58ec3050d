"""The capacity objective checked: its search against a brute-force scan, and its cost per engine.

Part 1, search against brute force: one engine (the spec's baseline: vLLM's defaults and
gpu-memory-utilization 0.2), started once and warmed up as a trial is. On it, the capacity
search (``measure_capacity``) runs ``--searches`` times; between the first search and the
second, a scan measures every rate of a geometric grid (step ``--grid-step``, from
``--grid-low`` to ``--grid-high`` times the first search's capacity) in a shuffled order, so
that a drift of the machine does not line up with the rate. Each scanned rate is measured by
``measure_rate``, as the search measures its rates: the same window length, idle wait, prefix
cache reset (or priming, on a trace with shared blocks), early stop and SLOs. The scan's
capacity is its highest passing rate. With ``--hinted``, searches 2, 4, ... start from the
capacity the search before found, with the small first step of a re-measurement
(``tuner.study.capacity.rate_search.start_hint``), so the plain and the hinted searches alternate
on one engine.

Part 2, windows per engine start: ``tuner run`` on the same spec with ``--objective capacity``
and with ``--objective latency``, ``--trials`` trials each, in a temporary folder, read back
from the study's SQLite storage: windows per trial (each trial is one engine start), and the
share of the trial's wall time that was measurement (``time_window_s``: in a capacity trial the
whole search, its idle waits and drains included) and that was sending requests.

Every vLLM this starts needs the machine's cores to itself, so run it under the CPU lock:

    flock /tmp/cpu.lock python benchmarks/capacity.py
    flock /tmp/cpu.lock python benchmarks/capacity.py --window-s 10 --searches 1 --grid-step 0.2
    flock /tmp/cpu.lock python benchmarks/capacity.py --skip-scan --trials 2
    flock /tmp/cpu.lock python benchmarks/capacity.py --skip-scan --searches 6 --hinted --trials 0
    flock /tmp/cpu.lock python benchmarks/capacity.py --result capacity   # benchmarks/results/
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import harness
import optuna
import yaml

from tuner.engine import Engine, write_model
from tuner.load import ReplaySettings, replay_in_process
from tuner.study import (
    CapacityFound,
    CapacitySettings,
    Criteria,
    RatePoint,
    StartHint,
    StudySpec,
    TimeScale,
    load_spec,
    measure_capacity,
    measure_rate,
)
from tuner.traces import build_workload, load_trace, model_info

REPO = Path(__file__).resolve().parent.parent
# Indices of the scan's windows start here: their prompts' seeds differ from the searches'.
SCAN_INDEX = 1000


def point_line(point: RatePoint) -> str:
    figures = point.figures
    ttft_ms = figures.get("ttft_p95_s", math.nan) * 1000
    e2e_s = figures.get("e2e_p99_s", math.nan)
    verdict = "pass" if point.passed else "FAIL"
    # How late tuner's own client ran (measured on windows that ran to the end).
    lag = figures.get("client_lag_max_s")
    lag_text = "" if lag is None else f"client lag {lag:4.2f} s  "
    return (
        f"{point.rate_req_per_s:7.3f} req/s  {verdict}  TTFT p95 {ttft_ms:6.0f} ms  "
        f"e2e p99 {e2e_s:5.2f} s  {lag_text}{point.reason or ''}"
    ).rstrip()


def spread(values: Sequence[float]) -> str:
    return f"median {statistics.median(values):.3f} [{min(values):.3f}-{max(values):.3f}]"


def grid(centre: float, low: float, high: float, step: float) -> list[float]:
    """Rates ``centre * (1 + step) ** k`` from ``low * centre`` to ``high * centre``."""
    ratio = 1.0 + step
    first = math.ceil(math.log(low) / math.log(ratio) - 1e-9)
    last = math.floor(math.log(high) / math.log(ratio) + 1e-9)
    return [centre * ratio**k for k in range(first, last + 1)]


def inversions(points: Sequence[RatePoint]) -> list[tuple[float, float]]:
    """Pairs (failed rate, higher passed rate): where the scan is not monotonic."""
    return [
        (low.rate_req_per_s, high.rate_req_per_s)
        for low in points
        for high in points
        if not low.passed and high.passed and high.rate_req_per_s > low.rate_req_per_s
    ]


def time_scale_of(spec: StudySpec) -> float:
    """The spec's time scale; 1 where it is ``auto``: this benchmark calibrates nothing."""
    return TimeScale(spec.time_scale).factor()


def within(ratio: float, resolution: float) -> bool:
    return max(ratio, 1 / ratio) <= 1 + resolution + 1e-9


def search_vs_scan(spec: StudySpec, options: argparse.Namespace, work: Path) -> None:
    model = str(write_model(work / "model", spec.dummy_model or "cpu-tiny"))
    max_len = spec.engine_args.get("max-model-len")
    info = model_info(model, int(max_len) if max_len else None)
    trace = load_trace(options.trace)
    workload = build_workload(trace, spec.window_s, time_scale_of(spec), info.max_model_len)
    requests = workload.trace.requests()
    settings = CapacitySettings(
        requests=requests,
        period_s=workload.replay_s,
        probe_s=options.window_s,
        resolution=spec.capacity_resolution,
        max_probes=spec.capacity_max_probes,
    )
    replay_settings = ReplaySettings(
        model=model, vocab_size=info.vocab_size, block_tokens=trace.block_tokens, seed=spec.seed
    )
    args = {**spec.engine_args, **spec.baseline}
    print(f"window: {workload.describe()}")
    print(
        f"engine: {args}; capacity window {settings.probe_s:g} s, resolution "
        f"{settings.resolution:g}, at most {settings.max_probes} windows a search"
    )
    criteria = Criteria.of(spec)
    engine = Engine(model, args, work / "engine", env={"VLLM_SERVER_DEV_MODE": "1"})
    found: list[tuple[CapacityFound, float]] = []
    scan: list[RatePoint] = []
    scan_s = 0.0
    with engine:
        healthy_s = engine.wait_healthy(options.health_timeout_s)
        warmup = requests[: spec.warmup_requests]
        replay_in_process(engine.base_url, warmup, replay_settings)
        print(f"engine healthy in {healthy_s:.1f} s, warmed up with {len(warmup)} requests")
        for n in range(options.searches):
            hinted = settings
            if options.hinted and n % 2 == 1 and found[-1][0].capacity_req_per_s > 0:
                # As a re-measurement in a study starts: from the capacity measured before.
                hint = StartHint(found[-1][0].capacity_req_per_s, repeat=True)
                hinted = dataclasses.replace(settings, hint=hint)
            began = time.monotonic()
            result = measure_capacity(engine.base_url, hinted, replay_settings, criteria)
            took_s = time.monotonic() - began
            found.append((result, took_s))
            start = "" if hinted.hint is None else f", from search {n}'s capacity"
            print(
                f"\nsearch {n + 1}: capacity {result.capacity_req_per_s:.3f} req/s in "
                f"{len(result.points)} windows, {took_s:.0f} s{start} ({result.why_stopped})"
            )
            for point in result.points:
                print("  " + point_line(point))
            if n == 0 and not options.skip_scan:
                centre = result.capacity_req_per_s or settings.start_req_per_s
                rates = grid(centre, options.grid_low, options.grid_high, options.grid_step)
                random.Random(options.seed).shuffle(rates)
                print(f"\nscan: {len(rates)} rates around {centre:.3f} req/s, in this order")
                began = time.monotonic()
                for i, rate in enumerate(rates):
                    point = measure_rate(
                        engine.base_url,
                        settings,
                        replay_settings,
                        criteria,
                        rate,
                        SCAN_INDEX + i,
                    )
                    scan.append(point)
                    print("  " + point_line(point), flush=True)
                scan_s = time.monotonic() - began

    capacities = [r.capacity_req_per_s for r, _ in found]
    print(f"\nsearches on one engine: capacity {spread(capacities)} req/s")
    print(f"  windows {[len(r.points) for r, _ in found]}, seconds {[round(s) for _, s in found]}")
    print(f"  resolved {[r.resolved for r, _ in found]}")
    if options.hinted:
        for name, group in (("plain", found[0::2]), ("from a capacity", found[1::2])):
            if group:
                print(
                    f"  {name}: windows {spread([len(r.points) for r, _ in group])}, seconds "
                    f"{spread([s for _, s in group])}, capacity "
                    f"{spread([r.capacity_req_per_s for r, _ in group])}"
                )
    if not scan:
        return
    ordered = sorted(scan, key=lambda p: p.rate_req_per_s)
    print("scan, by rate:")
    for point in ordered:
        print("  " + point_line(point))
    brute = max((p.rate_req_per_s for p in scan if p.passed), default=0.0)
    failed = [p.rate_req_per_s for p in scan if not p.passed]
    print(
        f"brute force: capacity {brute:.3f} req/s (highest passing rate), lowest failing "
        f"{min(failed, default=math.nan):.3f} req/s; {len(scan)} windows, {scan_s:.0f} s"
    )
    inverted = inversions(scan)
    if inverted:
        shown = ", ".join(f"{lo:.3f} failed < {hi:.3f} passed" for lo, hi in inverted)
        print(f"  not monotonic: {shown}")
    else:
        print("  monotonic: every passing rate is below every failing one")
    if brute <= 0:
        print("no scanned rate passed: no ratio")
        return
    for n, capacity in enumerate(capacities):
        ratio = capacity / brute
        verdict = "within" if within(ratio, settings.resolution) else "NOT within"
        print(f"search {n + 1} / brute force: {ratio:.3f} ({verdict} {settings.resolution:.0%})")
    ratio = statistics.median(capacities) / brute
    verdict = "within" if within(ratio, settings.resolution) else "NOT within"
    print(f"median search / brute force: {ratio:.3f} ({verdict} {settings.resolution:.0%})")


def run_study(mode: str, spec_file: Path, options: argparse.Namespace, work: Path) -> Path:
    """``tuner run`` as a user runs it; returns the study's storage."""
    name = f"cap-{mode}"
    command = [
        sys.executable, "-m", "tuner.cli", "run", "--trace", str(options.trace.resolve()),
        "--spec", str(spec_file), "--study", name, "--n-trials", str(options.trials),
        "--objective", mode,
    ]  # fmt: skip
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path}
    print(f"\n$ {' '.join(command[2:])}", flush=True)
    began = time.monotonic()
    done = subprocess.run(command, cwd=work, env=env, check=False)
    print(f"exit {done.returncode} after {time.monotonic() - began:.0f} s", flush=True)
    return work / "studies" / f"{name}.db"


def sending_s(attrs: Mapping[str, Any], spec: StudySpec, window_s: float) -> float:
    """Seconds the trial sent requests for: each window's length, or until it was stopped."""
    points = attrs.get("capacity_points")
    if points is None:
        return float(attrs.get("stopped_at_s", spec.window_s * time_scale_of(spec)))
    return sum(p.get("stopped_at_s", window_s) for p in points)


def study_costs(spec: StudySpec, options: argparse.Namespace, work: Path) -> None:
    raw = yaml.safe_load(options.spec.read_text())
    window_s = options.study_window_s or spec.capacity_probe_s
    raw["capacity_probe_s"] = window_s
    if not Path(raw["model"]).is_absolute():
        # Written by tuner run into the work folder, as into a user's checkout.
        raw["model"] = str(work / raw["model"])
    spec_file = work / "cap.yaml"
    spec_file.write_text(yaml.safe_dump(raw, sort_keys=False))
    rows = []
    for mode in ("capacity", "latency"):
        storage = run_study(mode, spec_file, options, work)
        study = optuna.load_study(study_name=f"cap-{mode}", storage=f"sqlite:///{storage}")
        for trial in study.get_trials():
            attrs = trial.user_attrs
            rows.append(
                {
                    "mode": mode,
                    "trial": trial.number,
                    "seqs": attrs.get("engine_args", {}).get("max-num-seqs", "d"),
                    "windows": attrs.get(
                        "capacity_windows", 1.0 if "time_window_s" in attrs else 0
                    ),
                    "capacity": attrs.get("capacity_req_per_s"),
                    "start": attrs.get("capacity_start_req_per_s"),
                    "trial_s": attrs.get("time_trial_s", 0.0),
                    "healthy_s": attrs.get("time_engine_healthy_s", 0.0),
                    "warmup_s": attrs.get("time_warmup_s", 0.0),
                    "window_s": attrs.get("time_window_s", 0.0),
                    "sending_s": sending_s(attrs, spec, window_s),
                }
            )
    print(f"\ncapacity window {window_s:g} s; trial times in seconds")
    print(
        f"{'mode':>9} {'trial':>5} {'seqs':>5} {'windows':>7} {'from':>7} {'capacity':>8} "
        f"{'trial':>7} {'start':>6} {'warmup':>6} {'measure':>7} {'sending':>7}"
    )
    for r in rows:
        capacity = "" if r["capacity"] is None else f"{r['capacity']:.3f}"
        start = "" if r["start"] is None else f"{r['start']:.3f}"
        print(
            f"{r['mode']:>9} {r['trial']:>5} {r['seqs']!s:>5} {r['windows']:>7.0f} {start:>7} "
            f"{capacity:>8} "
            f"{r['trial_s']:7.1f} {r['healthy_s']:6.1f} {r['warmup_s']:6.1f} "
            f"{r['window_s']:7.1f} {r['sending_s']:7.1f}"
        )
    for mode in ("capacity", "latency"):
        group = [r for r in rows if r["mode"] == mode]
        if not group:
            continue
        windows = [r["windows"] for r in group]
        total_s = sum(r["trial_s"] for r in group)
        measured = sum(r["window_s"] for r in group) / total_s if total_s else math.nan
        sent = sum(r["sending_s"] for r in group) / total_s if total_s else math.nan
        print(
            f"{mode}: windows per engine start {spread(windows)}, mean "
            f"{statistics.mean(windows):.2f} (goal >= 5: "
            f"{'met' if min(windows) >= 5 else 'not met'} by every trial); measurement "
            f"{measured:.0%} of trial time, sending {sent:.0%}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", type=Path, default=Path("studies/cap.yaml"))
    parser.add_argument("--trace", type=Path, default=Path("traces/azure-conv-peak.csv"))
    parser.add_argument(
        "--window-s", type=float, default=15.0, help="part 1's capacity window (seconds a rate)"
    )
    parser.add_argument("--searches", type=int, default=3, help="part 1's searches")
    parser.add_argument(
        "--hinted",
        action="store_true",
        help="part 1's searches 2, 4, ... start from the capacity of the search before (as a "
        "re-measurement in a study does)",
    )
    parser.add_argument("--grid-step", type=float, default=0.1, help="relative step of the scan")
    parser.add_argument("--grid-low", type=float, default=0.5, help="x the first capacity")
    parser.add_argument("--grid-high", type=float, default=2.0, help="x the first capacity")
    parser.add_argument("--seed", type=int, default=0, help="shuffles the scan's order")
    parser.add_argument("--skip-scan", action="store_true", help="searches only in part 1")
    parser.add_argument("--skip-search", action="store_true", help="leave out part 1")
    parser.add_argument("--trials", type=int, default=3, help="part 2's trials per mode")
    parser.add_argument(
        "--study-window-s", type=float, help="part 2's capacity window (default: the spec's)"
    )
    parser.add_argument("--health-timeout-s", type=float, default=600.0)
    parser.add_argument(
        "--result",
        metavar="NAME",
        help="write the result to benchmarks/results/NAME/ (README.md)",
    )
    options = parser.parse_args()

    spec = load_spec(options.spec)
    work = Path(tempfile.mkdtemp(prefix="capacity-"))
    with harness.Printed() as printed:
        print(f"spec {options.spec}, trace {options.trace}, work folder {work}")
        began = time.monotonic()
        if not options.skip_search:
            search_vs_scan(spec, options, work)
        if options.trials:
            study_costs(spec, options, work)
        rerun = " ".join(
            f"--{k.replace('_', '-')}" + ("" if v is True else f" {v}")
            for k, v in vars(options).items()
            if v is not None and v is not False and k != "result"
        )
        print(
            f"\ntook {time.monotonic() - began:.0f} s; rerun: flock /tmp/cpu.lock "
            f"python benchmarks/capacity.py {rerun}"
        )
    if options.result:
        title = "The capacity search against a brute-force scan of rates, on one engine"
        folder = harness.RESULTS / options.result
        harness.write_result(folder, title, harness.command_line(), printed.text())


if __name__ == "__main__":
    main()
