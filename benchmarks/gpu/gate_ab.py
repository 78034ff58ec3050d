"""A searched capacity trial's gate window, on fresh engines cold and warmed up, in turns.

A searched configuration in a capacity study is first replayed at the best capacity so far, and
a failure there ends its trial. That window is the first a fresh engine serves. Does a warm-up
before it change the verdict?

    python benchmarks/gpu/gate_ab.py --spec benchmarks/gpu/studies/story-cap.yaml \
        --trace benchmarks/gpu/traces/story-12rps.csv --gate 150 --runs 3 \
        --args '{"api-server-count": 2}' --warmup 200 --out gate/

Each run starts two engines one after the other with tuner's own trial (``run_trial``, the spec's
SLOs and capacity window, the search limited to its gate window): ``cold`` replays the gate
window first, ``warm`` first replays the window's first ``--warmup`` requests at the trace's pace
(the spec's ``warmup_requests``). One JSON line per engine goes to ``OUT/gate.jsonl`` as it ends;
a rerun skips what is there. At the end, and with ``--report`` alone, one line per engine and
each arm's passes.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from tuner.engine import environment
from tuner.engine.launchers import LAUNCHERS, auto_launcher
from tuner.study.measure.prepare import prepare
from tuner.study.measure.rate_search import RateSearch
from tuner.study.measure.trial import run_trial
from tuner.study.plan.space import capture_pin
from tuner.study.plan.spec import load_spec
from tuner.traces.formats import load_trace

SHOWN = ("ttft_p95_s", "tpot_p95_s", "e2e_p99_s", "client_lag_max_s")


def rows_of(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def report(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        f"{'run':>3} {'arm':>5} {'rate':>6} {'result':>7} " + " ".join(f"{k:>16}" for k in SHOWN)
    ]
    for row in rows:
        point = row.get("point", {})
        figures = " ".join(f"{point.get(k, float('nan')):16.3f}" for k in SHOWN)
        result = "passed" if point.get("passed") else "failed"
        lines.append(
            f"{row['run']:>3} {row['arm']:>5} {point.get('rate_req_per_s', 0):6.1f} {result:>7} "
            f"{figures}  {point.get('reason') or row.get('reason') or ''}"
        )
    for arm in dict.fromkeys(r["arm"] for r in rows):
        passed = [bool(r.get("point", {}).get("passed")) for r in rows if r["arm"] == arm]
        lines.append(f"{arm}: {sum(passed)} of {len(passed)} engines passed the gate window")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", type=Path, required=True)
    parser.add_argument("--trace", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--gate", type=float, required=True, help="the gate's rate, req/s")
    parser.add_argument("--args", type=json.loads, default={}, help="engine arguments, JSON")
    parser.add_argument("--warmup", type=int, default=200, help="the warm arm's requests")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--report", action="store_true", help="print the table and exit")
    options = parser.parse_args(argv)
    results = options.out / "gate.jsonl"
    if options.report:
        print("\n".join(report(rows_of(results))))
        return 0

    spec = load_spec(options.spec)
    options.out.mkdir(parents=True, exist_ok=True)
    launcher = LAUNCHERS[auto_launcher(environment.is_cpu_build())](options.out / "launcher.log")
    prepared = prepare(spec, load_trace(options.trace), launcher)
    replay, setup = prepared.replay, prepared.setup
    assert isinstance(setup.measure, RateSearch), "the spec is not a capacity study's"
    settings = replace(setup.measure.settings, gate_req_per_s=options.gate, max_rates=1)
    setup = replace(setup, measure=RateSearch(settings))
    engine_args = {**spec.engine_args, **capture_pin(spec, cpu_build=False), **options.args}
    arms = {"cold": (), "warm": tuple(replay.requests[: options.warmup])}
    done = {(r["run"], r["arm"]) for r in rows_of(results)}
    for run, arm in itertools.product(range(options.runs), arms):
        if (run, arm) in done:
            continue
        began = time.monotonic()
        outcome = run_trial(
            engine_args,
            replace(setup, warmup_requests=arms[arm]),
            options.out / f"r{run}-{arm}",
        )
        row = {
            "run": run,
            "arm": arm,
            "engine_args": dict(engine_args),
            "point": outcome.points[0] if outcome.points else {},
            "reason": outcome.reason,
            "timings": dict(outcome.timings),
            "took_s": round(time.monotonic() - began, 1),
        }
        with results.open("a") as out:
            out.write(json.dumps(row) + "\n")
        print("\n".join(report([row])[1:2]), flush=True)
    print("\n".join(report(rows_of(results))))
    print(f"rerun: python {' '.join(sys.argv)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
