"""Markdown tables from what ``capture.sh`` (commit e1eee0d) brought back: the A/B and the
study's engine starts.

python benchmarks/gpu/capture_report.py benchmarks/results/h100-capture

in a checkout of commit 5a1af5c^: the study's database left the tree after it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import optuna

from tuner.flags import MAX_CAPTURE_SIZE


def _ms(value: Any) -> str:
    return f"{value * 1000:.1f}" if isinstance(value, int | float) else "n/a"


def _s(value: Any) -> str:
    return f"{value:.1f}" if isinstance(value, int | float) else "-"


def ab_tables(path: Path) -> list[str]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    out = [
        "| run | max-num-seqs | arm | start s | compile cache hit | load | req/s offered | "
        "TTFT p50 ms | TTFT p95 ms | TPOT p50 ms | TPOT p95 ms | errors |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        if "failed" in row:
            out.append(
                f"| {row['run']} | {row['max_num_seqs']} | {row['arm']} | failed: "
                f"{row['failed']} | | | | | | | | |"
            )
            continue
        for load in row["loads"]:
            m = load["metrics"]
            out.append(
                f"| {row['run']} | {row['max_num_seqs']} | {row['arm']} | "
                f"{_s(row['engine_healthy_s'])} | {row.get('compile_cache_hit', '-')} | "
                f"x{load['time_scale']:g} | {load['offered_req_per_s']:.1f} | "
                f"{_ms(m.get('ttft_p50_s'))} | {_ms(m.get('ttft_p95_s'))} | "
                f"{_ms(m.get('tpot_p50_s'))} | {_ms(m.get('tpot_p95_s'))} | "
                f"{m.get('error_rate', 0):.0%} |"
            )
    groups: dict[tuple[int, float], dict[str, list[dict[str, float]]]] = {}
    for row in rows:
        for load in row.get("loads", []):
            key = (row["max_num_seqs"], load["time_scale"])
            groups.setdefault(key, {}).setdefault(row["arm"], []).append(load["metrics"])
    out += [
        "",
        "Median over runs, default range against pinned (ratio default / pinned):",
        "",
        "| max-num-seqs | load | metric | default ms | pinned ms | default / pinned |",
        "|---|---|---|---|---|---|",
    ]
    for (seqs, scale), arms in sorted(groups.items()):
        if not {"default", "pinned"} <= set(arms):
            continue
        for metric in ("ttft_p50_s", "ttft_p95_s", "tpot_p50_s", "tpot_p95_s"):
            d = statistics.median(m[metric] for m in arms["default"])
            p = statistics.median(m[metric] for m in arms["pinned"])
            out.append(
                f"| {seqs} | x{scale:g} | {metric} | {_ms(d)} | {_ms(p)} | {d / p:.2f} "
                f"(n={len(arms['default'])}, {len(arms['pinned'])}) |"
            )
    return out


def study_table(storage: str, name: str) -> list[str]:
    study = optuna.load_study(study_name=name, storage=storage)
    out = [
        "| trial | max-num-seqs | gpu-mem-util | capture max | compile key | cache hit | "
        "healthy s | compile s | capture s | init rest s | TTFT p95 ms | TPOT p95 ms |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for t in study.get_trials(deepcopy=False):
        a = t.user_attrs
        args = a.get("engine_args", {})
        out.append(
            f"| {t.number}{' (baseline)' if a.get('baseline') else ''} | "
            f"{args.get('max-num-seqs', 'default')} | "
            f"{args.get('gpu-memory-utilization', 'default')} | "
            f"{args.get(MAX_CAPTURE_SIZE, 'default')} | {a.get('compile_key', '-')} | "
            f"{a.get('compile_cache_hit', '-')} | {_s(a.get('time_engine_healthy_s'))} | "
            f"{_s(a.get('time_startup_torch_compile_s'))} | "
            f"{_s(a.get('time_startup_cuda_graph_s'))} | "
            f"{_s(a.get('time_startup_init_rest_s'))} | "
            f"{_ms(a.get('ttft_p95_s'))} | {_ms(a.get('tpot_p95_s'))} |"
        )
    starts = [
        t.user_attrs["time_engine_healthy_s"]
        for t in study.get_trials(deepcopy=False)[1:]
        if "time_engine_healthy_s" in t.user_attrs
    ]
    if starts:
        median = statistics.median(starts)
        out += [
            "",
            f"Engine start of trials 1 onward: median {median:.1f} s over {len(starts)} trials "
            f"(min {min(starts):.1f}, max {max(starts):.1f}).",
        ]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    args = parser.parse_args(argv)
    ab = args.folder / "ab" / "ab.jsonl"
    db = args.folder / "study" / "study.db"
    if db.exists():
        print("## Study\n")
        print("\n".join(study_table(f"sqlite:///{db}", "capture")))
    if ab.exists():
        print("\n## A/B\n")
        print("\n".join(ab_tables(ab)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
