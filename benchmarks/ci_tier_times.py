"""What a recorded run of the checks took, tier by tier, from the file that
``TUNER_DURATIONS_OUT=FILE bash .ci/tiers`` writes (tests/ci_durations.py): each tier's wall
seconds, its tests, their seconds added up and on two processes longest first, and its slowest
tests; then the seconds of each test file in the vllm tier.

    python benchmarks/ci_tier_times.py tests/data/ci-durations.json [--slowest N]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from ci_durations import BUDGET_S, file_of, makespan_s


def report(recorded: dict, slowest: int) -> str:
    lines = [
        f"measured {recorded.get('measured', '?')}, commit {recorded.get('commit', '?')}, "
        f"{recorded.get('machine', '?')}",
        "",
        "| tier | wall | tests | their seconds | on 2 processes | budget |",
        "|---|---|---|---|---|---|",
    ]
    for name, tier in recorded["tiers"].items():
        seconds = tier["tests"].values()
        budget = f"{BUDGET_S[name]:.0f} s" if name in BUDGET_S else "-"
        lines.append(
            f"| {name} | {tier['wall_s']:.0f} s | {len(tier['tests'])} | {sum(seconds):.0f} s "
            f"| {makespan_s(seconds):.0f} s | {budget} |"
        )
    for name, tier in recorded["tiers"].items():
        lines += ["", f"{name}: the {slowest} slowest tests (setup, call and teardown)", ""]
        ranked = sorted(tier["tests"].items(), key=lambda kv: -kv[1])[:slowest]
        lines += [f"    {seconds:7.1f} s  {nodeid}" for nodeid, seconds in ranked]
    if "vllm" in recorded["tiers"]:
        per_file: Counter[str] = Counter()
        for nodeid, seconds in recorded["tiers"]["vllm"]["tests"].items():
            per_file[file_of(nodeid)] += seconds
        lines += ["", "vllm: seconds per test file", ""]
        lines += [f"    {seconds:7.1f} s  {name}" for name, seconds in per_file.most_common()]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("recorded", type=Path)
    parser.add_argument("--slowest", type=int, default=15)
    args = parser.parse_args()
    print(report(json.loads(args.recorded.read_text()), args.slowest))
    print(f"\npython benchmarks/ci_tier_times.py {args.recorded} --slowest {args.slowest}")


if __name__ == "__main__":
    main()
