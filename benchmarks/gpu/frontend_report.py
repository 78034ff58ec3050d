"""Tables from what ``frontend.sh`` brought back: ``probe DIR`` (windows.jsonl and py-spy's raw
profiles of ``frontend.py probe``) and ``ab DIR`` (the study of ``frontend.py ab`` of commit
3dbe6e9).

    python benchmarks/gpu/frontend_report.py probe benchmarks/results/h100-frontend/probe
    python benchmarks/gpu/frontend_report.py ab benchmarks/results/h100-frontend/ab

Markdown on stdout. py-spy's profiles are read as written or compressed (``.txt.xz``); ``ab``
reads ``study.db`` (also a ``tuner run`` study's folder). The folders above hold their
profiles and databases in a checkout of commit 5a1af5c^; they left the tree after it.
"""

from __future__ import annotations

import argparse
import json
import lzma
import re
import statistics
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

FRAME = re.compile(r"^(?P<func>.*?) \((?P<where>[^()]*)\)$")


def ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.0f}"


def windows(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (folder / "windows.jsonl").read_text().splitlines()]


def window_table(records: Iterable[Mapping[str, Any]]) -> list[str]:
    rows = [
        "| window | rate (req/s) | requests | judged on | TTFT p95 (ms) | TPOT p95 (ms) "
        "| e2e p99 (s) | SLOs |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        for name, part in r["parts"].items():
            verdict = (
                "pass"
                if part["passed"]
                else "miss " + ", ".join(v.removeprefix("slo_") for v in part["violations"])
            )
            e2e = part.get("e2e_p99_s")
            rows.append(
                f"| {r['label']} | {r['rate_req_per_s']:.0f} | {part.get('requests', 0):.0f} "
                f"| {name} | {ms(part.get('ttft_p95_s'))} | {ms(part.get('tpot_p95_s'))} "
                f"| {'-' if e2e is None else f'{e2e:.2f}'} | {verdict} |"
            )
    return rows


def where_table(records: Iterable[Mapping[str, Any]]) -> list[str]:
    """Client TTFT against vLLM's own stages, over each whole window; CPU; the engine's steps."""
    rows = [
        "| window | client TTFT mean / p95 | vLLM TTFT mean / p95 | vLLM queue mean / p95 "
        "| vLLM prefill mean | vLLM ITL mean | API server cores (main thread) | engine core cores "
        "(main thread) | steps/s | tokens/step mean | running peak | waiting peak | late JIT "
        "| client lag p99 |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        f = r["figures"]
        cpu = r["cpu_cores"]
        api = cpu.get("api", {})
        core = cpu.get("engine_core", {})
        steps = r.get("steps") or {}
        running = [g[0] for g in r["gauges"] if g[0] is not None]
        waiting = [g[1] for g in r["gauges"] if g[1] is not None]
        per_s = (steps.get("steps") or 0) / r["wall_s"] if r["wall_s"] else 0
        rows.append(
            f"| {r['label']} | {ms(f.get('ttft_mean_s'))} / {ms(f.get('ttft_p95_s'))} "
            f"| {ms(f.get('server_ttft_mean_s'))} / {ms(f.get('server_ttft_p95_s'))} "
            f"| {ms(f.get('server_queue_mean_s'))} / {ms(f.get('server_queue_p95_s'))} "
            f"| {ms(f.get('server_prefill_mean_s'))} | {ms(f.get('server_itl_mean_s'))} "
            f"| {api.get('process', 0):.2f} ({api.get('main_thread', 0):.2f}) "
            f"| {core.get('process', 0):.2f} ({core.get('main_thread', 0):.2f}) "
            f"| {per_s:.0f} | {steps.get('tokens_per_step_mean') or 0:.0f} "
            f"| {max(running, default=0):.0f} | {max(waiting, default=0):.0f} "
            f"| {len(r['late_jit'])} | {ms(f.get('client_lag_p99_s'))} |"
        )
    return rows


def timeline_table(record: Mapping[str, Any]) -> list[str]:
    rows = [
        f"{record['label']} ({record['rate_req_per_s']:.0f} req/s), by second of sending:",
        "",
        "| second | requests | TTFT p50 (ms) | TTFT p95 (ms) | TTFT max (ms) | running | waiting |",
        "|---|---|---|---|---|---|---|",
    ]
    gauges = record["gauges"]
    for row in record["timeline"]:
        s = row["s"]
        running, waiting = gauges[s] if s < len(gauges) else (None, None)
        rows.append(
            f"| {s} | {row['n']} | {ms(row['ttft_p50_s'])} | {ms(row['ttft_p95_s'])} "
            f"| {ms(row['ttft_max_s'])} | {'-' if running is None else f'{running:.0f}'} "
            f"| {'-' if waiting is None else f'{waiting:.0f}'} |"
        )
    return rows


def read_profile(path: Path) -> dict[str, Counter[tuple[str, ...]]]:
    """py-spy's raw output: stacks (outermost first) and their sample counts, by thread name."""
    threads: dict[str, Counter[tuple[str, ...]]] = {}
    raw = path.read_bytes()
    text = (lzma.decompress(raw) if path.suffix == ".xz" else raw).decode()
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        thread, *frames = stack.split(";")
        name = thread.split(": ", 1)[1] if ": " in thread else thread
        threads.setdefault(name, Counter())[tuple(frames)] += int(count)
    return threads


def short(frame: str) -> str:
    match = FRAME.match(frame)
    if not match:
        return frame
    where = match["where"].rsplit(":", 1)[0]
    return f"{match['func']} ({where})"


# Where a thread's own work starts: frames up to the last of these are the launch chain (the
# zygote's fork, vLLM's process start), the same in every sample.
ANCHORS = ("Runner.run (", "EngineCoreProc.run_busy_loop (")


def own_frames(stack: tuple[str, ...]) -> tuple[str, ...]:
    """The frames above the innermost anchor (the whole stack where there is none)."""
    last = max((i for i, f in enumerate(stack) if f.startswith(ANCHORS)), default=-1)
    return stack[last + 1 :]


def profile_table(path: Path, top: int = 14) -> list[str]:
    """The main thread: samples in the event loop's or the busy loop's own code (no Python frame
    above it), and the functions the others were in (inclusive: anywhere above the loop; self:
    innermost), most first; the other threads' samples."""
    threads = read_profile(path)
    main = threads.get("MainThread", Counter())
    total = sum(main.values())
    rows = [f"{path.name}: {total} main-thread samples (100 a second)"]
    if not total:
        return rows
    in_loop = sum(n for stack, n in main.items() if not own_frames(stack))
    rows.append(f"- in the loop's own code (no Python function above it): {in_loop / total:.0%}")
    inclusive: Counter[str] = Counter()
    leaf: Counter[str] = Counter()
    for stack, n in main.items():
        frames = own_frames(stack)
        for frame in sorted({short(f) for f in frames}):
            inclusive[frame] += n
        if frames:
            leaf[short(frames[-1])] += n
    rows += ["", "| function (main thread) | inclusive | self |", "|---|---|---|"]
    for frame, n in inclusive.most_common(top):
        rows.append(f"| `{frame}` | {n / total:.0%} | {leaf.get(frame, 0) / total:.0%} |")
    rows += ["", "| innermost function (main thread) | self |", "|---|---|"]
    for frame, n in leaf.most_common(top):
        rows.append(f"| `{frame}` | {n / total:.0%} |")
    return rows


def cmd_probe(folder: Path) -> None:
    records = windows(folder)
    meta = json.loads((folder / "meta.json").read_text())
    print(f"vLLM healthy after {meta['healthy_s']:.0f} s on {meta['measured_on']}\n")
    print("\n".join(window_table(records)) + "\n")
    print("\n".join(where_table(records)) + "\n")
    for r in records:
        if not r["ramped"]:
            print("\n".join(timeline_table(r)) + "\n")
    for path in sorted(folder.glob("pyspy-*.txt*")):
        print("\n".join(profile_table(path)) + "\n")


def cmd_ab(folder: Path) -> None:
    import optuna

    storage = f"sqlite:///{folder / 'study.db'}"
    name = optuna.get_all_study_names(storage)[0]
    study = optuna.load_study(study_name=name, storage=storage)
    groups: dict[str, list[Any]] = {}
    for t in study.trials:
        if t.state != optuna.trial.TrialState.COMPLETE:
            continue
        args = t.user_attrs.get("engine_args", {})
        label = ", ".join(
            f"{k} {v}" for k, v in args.items() if k not in ("load-format", "max-model-len")
        )
        groups.setdefault(label or "vLLM's defaults", []).append(t)
    print(
        "| configuration | capacity median (req/s) | min to max | engines | each (trial: rates) |"
    )
    print("|---|---|---|---|---|")
    for label, trials in groups.items():
        values = [float(t.user_attrs.get("capacity_req_per_s") or 0) for t in trials]
        each = "; ".join(
            f"{t.number}: {float(t.user_attrs.get('capacity_req_per_s') or 0):.1f} ("
            + " ".join(
                f"{p['rate_req_per_s']:.0f}{'+' if p['passed'] else '-'}"
                for p in t.user_attrs.get("capacity_points", [])
            )
            + ")"
            for t in trials
        )
        print(
            f"| {label} | {statistics.median(values):.1f} | {min(values):.1f} to "
            f"{max(values):.1f} | {len(values)} | {each} |"
        )
    print()
    print(
        "| trial | configuration | engine healthy (s) | at capacity: TTFT p95 / TPOT p95 (ms), "
        "running peak | lowest failing rate: why (TTFT p95 / TPOT p95 ms) |"
    )
    print("|---|---|---|---|---|")
    for label, trials in groups.items():
        for t in trials:
            points = t.user_attrs.get("capacity_points", [])
            passed = [p for p in points if p["passed"]]
            failed = [p for p in points if not p["passed"]]
            best = max(passed, key=lambda p: p["rate_req_per_s"]) if passed else None
            low = min(failed, key=lambda p: p["rate_req_per_s"]) if failed else None
            at = (
                f"{ms(best.get('ttft_p95_s'))} / {ms(best.get('tpot_p95_s'))}, "
                f"{best.get('running_peak', 0):.0f}"
                if best
                else "-"
            )
            why = (
                f"{low['rate_req_per_s']:.0f} req/s: {low.get('reason', '')} "
                f"({ms(low.get('ttft_p95_s'))} / {ms(low.get('tpot_p95_s'))})"
                if low
                else "-"
            )
            print(
                f"| {t.number} | {label} | {t.user_attrs.get('time_engine_healthy_s', 0):.0f} "
                f"| {at} | {why} |"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("probe", "ab"))
    parser.add_argument("folder", type=Path)
    args = parser.parse_args()
    cmd_probe(args.folder) if args.what == "probe" else cmd_ab(args.folder)


if __name__ == "__main__":
    main()
