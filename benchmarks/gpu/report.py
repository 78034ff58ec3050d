"""Tables and plots of a GPU study that came back from the device machine.

    python benchmarks/gpu/report.py benchmarks/results/h100-story --name story \
        --db tests/data/h100-story/study.db --configs tests/data/h100-story/configs \
        --out /tmp/h100-story

Reads ``DIR/study.db`` (the Optuna study) and ``DIR/loop.jsonl`` (each iteration's wall time)
and, if present, ``DIR/validate-*.json``; writes ``DIR/tables.md`` and PNG plots into ``DIR``
(``--out`` elsewhere): ``tuner report``'s figures, drawn by the same module
(``tuner.report.plots``). Every number comes from those files.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from tuner.report import (
    MOST_CURVES,
    RATES,
    RATES_FIGURE,
    StudyReport,
    curves,
    plot_cost,
    plot_history,
    plot_landscape,
    plot_rates,
    plot_trials,
    presenter_of,
    read_report,
    rows_of,
    searched_parameters,
    slo_limits,
)
from tuner.study import CONFIRMS_ATTR, servers_for, time_spent

SPACE = ("max-num-seqs", "max-num-batched-tokens", "gpu-memory-utilization")


def kind(t: FrozenTrial) -> str:
    origin = t.user_attrs.get(CONFIRMS_ATTR)
    if isinstance(origin, int):  # a re-measurement of the confirmation step
        return f"repeat of {origin}"
    if t.user_attrs.get("baseline"):
        return "defaults"
    # Studies before the spec had candidates enqueued it with a "hand_tuned" attribute.
    if t.user_attrs.get("hand_tuned"):
        return "hand-tuned"
    candidate = t.user_attrs.get("candidate")
    if isinstance(candidate, int) and not isinstance(candidate, bool):
        return f"candidate {candidate}"
    return "search"


def params(t: FrozenTrial) -> str:
    args = t.user_attrs.get("engine_args", {})
    shown = [f"{args[k]}" if k in args else "-" for k in SPACE]
    return " / ".join(shown)


def ms(attrs: dict[str, Any], key: str) -> str:
    value = attrs.get(key)
    return f"{value * 1000:.1f}" if isinstance(value, int | float) else "n/a"


def num(attrs: dict[str, Any], key: str, fmt: str = ".1f") -> str:
    value = attrs.get(key)
    return format(value, fmt) if isinstance(value, int | float) else "n/a"


def triple(attrs: dict[str, Any], prefix: str) -> str:
    return " / ".join(ms(attrs, f"{prefix}_p{q}_s") for q in (50, 95, 99))


def trial_table(trials: list[FrozenTrial], best: int | None) -> list[str]:
    rows = [
        "| trial | config | max-num-seqs / max-num-batched-tokens / gpu-mem-util | feasible "
        "| TTFT p50 / p95 / p99 ms | TPOT p50 / p95 / p99 ms | e2e p50 / p95 / p99 ms "
        "| req/s | out tok/s | running mean / peak | waiting peak | score |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for t in trials:
        a = t.user_attrs
        mark = " **best**" if t.number == best else ""
        reason = a.get("reason", "")
        feasible = "yes" if a.get("feasible") else f"no ({reason[:80]})" if reason else "no"
        score = f"{t.value:.3f}" if t.value is not None else t.state.name
        rows.append(
            f"| {t.number}{mark} | {kind(t)} | {params(t)} | {feasible} | {triple(a, 'ttft')} "
            f"| {triple(a, 'tpot')} | {triple(a, 'e2e')} | {num(a, 'throughput_req_per_s', '.2f')} "
            f"| {num(a, 'throughput_output_tokens_per_s', '.0f')} "
            f"| {num(a, 'running_mean')} / {num(a, 'running_peak', '.0f')} "
            f"| {num(a, 'waiting_peak', '.0f')} | {score} |"
        )
    return rows


def cost_table(trials: list[FrozenTrial], walls: list[dict[str, Any]]) -> list[str]:
    # Studies run one ``tuner run`` per trial recorded a wall time per trial (one line each
    # in loop.jsonl); a study run as one ``tuner run`` has one line, and its share is the
    # study's, below.
    per_trial = len(walls) > 1 or (len(walls) == 1 and len(trials) == 1)
    rows = [
        "| trial | engine start s | of it, model load s | warm-up s | window s | shutdown s "
        "| trial s | not measurement |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for i, t in enumerate(trials):
        a = t.user_attrs
        window = a.get("time_window_s", 0.0)
        whole = walls[i].get("wall_s") if per_trial and i < len(walls) else a.get("time_trial_s")
        share = f"{1 - window / whole:.0%}" if whole else "n/a"
        rows.append(
            f"| {t.number} | {num(a, 'time_engine_healthy_s')} "
            f"| {num(a, 'time_startup_model_load_s')} | {num(a, 'time_warmup_s')} "
            f"| {num(a, 'time_window_s')} | {num(a, 'time_engine_stop_s')} "
            f"| {num(a, 'time_trial_s')} | {share} |"
        )
    if walls:
        study_s = walls[-1]["start_epoch"] + walls[-1]["wall_s"] - walls[0]["start_epoch"]
        measured = sum(t.user_attrs.get("time_window_s", 0.0) for t in trials)
        starts = [t.user_attrs["time_engine_healthy_s"] for t in trials
                  if "time_engine_healthy_s" in t.user_attrs]  # fmt: skip
        rows += [
            "",
            f"Study wall time {study_s:.0f} s for {len(trials)} trials; measurement windows "
            f"{measured:.0f} s, so **{1 - measured / study_s:.0%} of the study's wall time was "
            f"not measurement**. Engine start median {statistics.median(starts):.0f} s "
            f"(min {min(starts):.0f}, max {max(starts):.0f})."
            if starts
            else f"Study wall time {study_s:.0f} s; measurement {measured:.0f} s.",
        ]
    return rows


def server_table(trials: list[FrozenTrial]) -> list[str]:
    """Where each trial's time went, from vLLM's own /metrics over its recorded window (a
    capacity trial's: the window at its capacity, else at the lowest rate it tried): the mean
    seconds a request spent queued, in prefill and in decode, the inter-token latency, the
    KV-cache share used, the share of prompt tokens found in the prefix cache, preemptions, and
    prompt and generated tokens a second; then why the first failing rate above it failed."""
    rows = [
        "| trial | config | queue mean ms | prefill mean ms | decode mean ms | ITL p95 ms "
        "| KV cache mean / peak | prefix cache hits | preemptions | running mean / peak "
        "| waiting peak | prompt tok/s | out tok/s | the rate above: why it failed |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for t in trials:
        a = t.user_attrs
        duration = a.get("duration_s")

        def per_s(key: str, a: dict[str, Any] = a, duration: Any = duration) -> str:
            value = a.get(key)
            ok = isinstance(value, int | float) and isinstance(duration, int | float)
            return f"{value / duration:.0f}" if ok and duration else "n/a"

        kv = " / ".join(
            f"{a[k]:.0%}" if isinstance(a.get(k), int | float) else "n/a"
            for k in ("kv_cache_usage_mean", "kv_cache_usage_peak")
        )
        hit_rate = time_spent(a).prefix_cache_hit_rate
        hits = "n/a" if hit_rate is None else f"{hit_rate:.0%}"
        capacity = a.get("capacity_req_per_s")
        above = [
            p for p in a.get("capacity_points", [])
            if not p.get("passed") and isinstance(capacity, int | float)
            and p["rate_req_per_s"] > capacity
        ]  # fmt: skip
        first = min(above, key=lambda p: p["rate_req_per_s"]) if above else None
        why = f"{first['rate_req_per_s']:.1f} req/s: {first.get('reason', '')}" if first else "-"
        rows.append(
            f"| {t.number} | {kind(t)} | {ms(a, 'server_queue_mean_s')} "
            f"| {ms(a, 'server_prefill_mean_s')} | {ms(a, 'server_decode_mean_s')} "
            f"| {ms(a, 'server_itl_p95_s')} | {kv} | {hits} "
            f"| {num(a, 'server_preemptions', '.0f')} "
            f"| {num(a, 'running_mean')} / {num(a, 'running_peak', '.0f')} "
            f"| {num(a, 'waiting_peak', '.0f')} | {per_s('server_prompt_tokens')} "
            f"| {per_s('server_generation_tokens')} | {why} |"
        )
    return rows


def validation_table(docs: list[dict[str, Any]]) -> list[str]:
    keys = [
        ("ttft", "TTFT"),
        ("tpot", "TPOT"),
        ("e2e", "e2e"),
    ]
    rows = [
        "| config | repeats | "
        + " | ".join(f"{t} p{q} ms" for _, t in keys for q in (50, 95, 99))
        + " | req/s | out tok/s |",
        "|---|---|" + "---|" * 11,
    ]
    for doc in docs:
        ok = [r["metrics"] for r in doc["repeats"] if r.get("metrics")]

        def cell(key: str, scale: float, ok: list[dict[str, float]] = ok) -> str:
            values = [m[key] * scale for m in ok if key in m]
            if not values:
                return "n/a"
            return f"{statistics.median(values):.1f} [{min(values):.1f}-{max(values):.1f}]"

        cells = [cell(f"{p}_p{q}_s", 1000) for p, _ in keys for q in (50, 95, 99)]
        cells += [cell("throughput_req_per_s", 1), cell("throughput_output_tokens_per_s", 1)]
        rows.append(
            f"| {doc['label']} | {len(ok)}/{len(doc['repeats'])} | " + " | ".join(cells) + " |"
        )
    rows.append("")
    rows.append("Cells: median over repeats [min-max].")
    return rows


def capacity_table(trials: list[FrozenTrial], peak_req_per_s: float | None) -> list[str]:
    """A capacity study's configurations, each with every measurement of it (the first and the
    confirm step's re-measurements): capacities, their median and spread, and the servers the
    trace's peak needs at the median. A capacity marked ``>=`` is a lower bound (the search
    ended unresolved)."""
    groups: dict[int, list[FrozenTrial]] = {}
    for t in trials:
        if t.state != TrialState.COMPLETE or "capacity_req_per_s" not in t.user_attrs:
            continue
        origin = t.user_attrs.get(CONFIRMS_ATTR)
        groups.setdefault(origin if isinstance(origin, int) else t.number, []).append(t)
    rows = [
        "| configuration | max-num-seqs / max-num-batched-tokens / gpu-mem-util | trials "
        "| capacity each, req/s | median [min-max] req/s | x peak | servers for the peak |",
        "|---|---|---|---|---|---|---|",
    ]
    ranked = sorted(
        groups.items(),
        key=lambda item: -statistics.median(t.user_attrs["capacity_req_per_s"] for t in item[1]),
    )
    for first, group in ranked:
        values = [t.user_attrs["capacity_req_per_s"] for t in group]
        each = ", ".join(
            f"{'' if t.user_attrs.get('capacity_resolved') else '>='}"
            f"{t.user_attrs['capacity_req_per_s']:.1f}"
            if t.user_attrs.get("capacity_points")
            else "no rate measured"
            for t in group
        )
        median = statistics.median(values)
        spread = f"{median:.1f} [{min(values):.1f}-{max(values):.1f}]"
        times = f"{median / peak_req_per_s:.1f}" if peak_req_per_s else "n/a"
        servers = servers_for(peak_req_per_s, median) if peak_req_per_s else None
        rows.append(
            f"| {kind(group[0])} (trial {first}) | {params(group[0])} "
            f"| {', '.join(str(t.number) for t in group)} | {each} | {spread} | {times} "
            f"| {servers if servers is not None else 'n/a'} |"
        )
    if peak_req_per_s:
        rows += ["", f"The trace's peak: {peak_req_per_s:.2f} req/s (its busiest window)."]
    return rows


def rates_plot(
    report: StudyReport, numbers: list[int] | None, slos: dict[str, float], path: Path
) -> Path | None:
    """``tuner report``'s latency against offered rate (``tuner.report.build``): of the trials
    ``numbers`` only, else of those it chooses; in the words of the study's presenter."""
    if numbers is None:
        rows, most = report.rows, MOST_CURVES
    else:
        rows, most = tuple(r for r in report.rows if r.number in numbers), len(numbers)
    drawn = curves(rows, report.parameters, slos, most)
    return plot_rates(drawn, slos, path, presenter_of(report.objective))


def plots(trials: list[FrozenTrial], out: Path, slos: dict[str, float] | None) -> list[str]:
    """The figures of ``tuner report`` (``tuner.report.plots``), as PNGs in ``out``.

    ``slos``: the spec's; by default, those the trials were held to (from their constraints).
    """
    rows = [
        # Studies before the spec had candidates marked their hand-tuned trial "hand_tuned".
        replace(row, kind="hand-tuned") if row.figures.get("hand_tuned") else row
        for row in rows_of(trials)
    ]
    limits = slo_limits(rows) if slos is None else slos
    written = (
        plot_cost(rows, out / "trial-cost.png"),
        plot_trials(rows, limits, out / "trial-latency.png"),
        plot_history(rows, out / "history.png"),
        plot_landscape(rows, searched_parameters(trials), limits, out / "landscape.png"),
    )
    return [path.name for path in written if path is not None]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir", type=Path)
    parser.add_argument("--name", required=True, help="study name")
    parser.add_argument(
        "--spec", type=Path, help="the study spec, for the SLO lines (default: from the study)"
    )
    parser.add_argument("--out", type=Path, help="where tables.md and the PNGs go (default: DIR)")
    parser.add_argument("--db", help="the study's database file (default: DIR/study.db)")
    parser.add_argument(
        "--configs", type=Path, help="the folder of the YAML tuner wrote (default: DIR/configs)"
    )
    parser.add_argument(
        "--rates",
        help="a capacity study: the trials (comma-separated numbers) whose latency against "
        "offered rate rates.png draws (default: tuner report's choice)",
    )
    args = parser.parse_args(argv)
    out = args.out or args.dir
    out.mkdir(parents=True, exist_ok=True)
    storage = f"sqlite:///{args.db or args.dir / 'study.db'}"
    study = optuna.load_study(study_name=args.name, storage=storage)
    trials = [t for t in study.get_trials() if t.state != TrialState.WAITING]
    walls = []
    loop = args.dir / "loop.jsonl"
    if loop.exists():
        walls = [json.loads(line) for line in loop.read_text().splitlines() if line.strip()]
    # The trial tuner writes (tuner.study.result.choice.choose, through tuner report's reading): the
    # median measurement of the feasible configuration with the best median.
    report = read_report(args.name, storage, args.configs or args.dir / "configs")
    # What the study shows follows from its objective, as tuner report's page asks it: the
    # rates each trial measured (the capacity table) and latency against offered rate.
    shown = presenter_of(report.objective)
    best = report.chosen if report.meets_slos else None
    written = report.configuration.trial if report.configuration else None
    if report.configuration and report.configuration.written and written != report.chosen:
        print(
            f"report.py: {report.configuration.path} says trial {written}; tuner's choice is "
            f"trial {report.chosen} (tuner run --n-trials 0 on the study writes it)",
            file=sys.stderr,
        )
    slos: dict[str, float] | None = None
    if args.spec:
        from tuner.study import load_spec

        slos = dict(load_spec(args.spec).slos)
    lines = []
    if RATES in shown.rows:
        workload = study.user_attrs.get("workload", {})
        window_s, requests = workload.get("window_s"), workload.get("requests")
        peak = requests / window_s if window_s and requests else None
        lines += [f"### Capacity of study `{args.name}`", "", *capacity_table(trials, peak), ""]
    lines += [f"### Trials of study `{args.name}`", "", *trial_table(trials, best), ""]
    lines += ["### Where the time went, per trial (vLLM's /metrics)", "", *server_table(trials), ""]
    lines += ["### Trial cost", "", *cost_table(trials, walls), ""]
    docs = [json.loads(p.read_text()) for p in sorted(args.dir.glob("validate-*.json"))]
    if docs:
        lines += ["### Validation", "", *validation_table(docs), ""]
    pngs = plots(trials, out, slos)
    if RATES_FIGURE in shown.figures:
        limits = slos if slos is not None else slo_limits(report.rows)
        numbers = [int(n) for n in args.rates.split(",")] if args.rates else None
        drawn = rates_plot(report, numbers, limits, out / "rates.png")
        if drawn is not None:
            pngs.insert(0, drawn.name)
    for png in pngs:
        lines.append(f"![{png}]({png})")
    (out / "tables.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
