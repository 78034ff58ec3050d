"""What ``tuner run`` prints about trials, and of the configuration it wrote."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import optuna

from tuner.cli.exits import EXIT_DEFAULTS_KEPT, EXIT_FAILED, EXIT_MEETS_SLOS, EXIT_MISSES_SLOS
from tuner.cli.inputs import spec_path
from tuner.engine.environment import command_to_serve
from tuner.load.observe import LOOP_LAG_WARNING_S
from tuner.study.measure.trial import ENGINE_START_S, TRIAL_S, WINDOW_S
from tuner.study.plan.layouts import layout_of
from tuner.study.result.choice import DEFAULTS, MISSES, TUNED, UNCONFIRMED
from tuner.study.result.emit import HEADLINE, format_figure, verdict_lines
from tuner.study.result.words import words_of
from tuner.study.result.written import Written
from tuner.study.setup.objective import of_trial
from tuner.study.store.record import TrialRecord
from tuner.study.trials import picks

# The exit status of ``tuner run`` for each outcome of ``tuner.study.result.choice``; where no
# trial served, ``EXIT_FAILED``.
OUTCOME_EXITS = {
    TUNED: EXIT_MEETS_SLOS,
    DEFAULTS: EXIT_DEFAULTS_KEPT,
    UNCONFIRMED: EXIT_MISSES_SLOS,
    MISSES: EXIT_MISSES_SLOS,
}


def fmt_params(args: Mapping[str, Any], space_names: Sequence[str]) -> str:
    """A trial's searched arguments as NAME=VALUE words; "(vLLM defaults)" where none is set."""
    shown = {k: v for k, v in args.items() if k in space_names} or {"(vLLM defaults)": ""}
    # None: left to vLLM's default (a field of a nested config such as the capture range).
    return " ".join(
        f"{k}={'default' if v is None else v}" if v != "" else k for k, v in shown.items()
    )


# What a trial's progress line shows: label, figure (``TrialRecord.figures``), scale, decimals,
# unit.
LINE_FIGURES = (
    ("ttft p95", "ttft_p95_s", 1000, 0, " ms"),
    ("tpot p95", "tpot_p95_s", 1000, 1, " ms"),
    ("e2e p99", "e2e_p99_s", 1, 2, " s"),
    ("throughput", "throughput_req_per_s", 1, 2, " req/s"),
    ("queue peak", "waiting_peak", 1, 0, ""),
)


def trial_line(trial: Any, space_names: Sequence[str]) -> str:
    """One finished trial as ``tuner run`` prints it: its arguments, state, figures and why."""
    recorded = TrialRecord.of(trial)
    figures = recorded.figures
    state = "feasible" if recorded.feasible else "infeasible"
    if trial.state.name == "PRUNED":
        state = "pruned"
    if recorded.baseline:
        state += ", baseline"
    if recorded.candidate is not None:
        state += f", the spec's candidate {recorded.candidate}"
    if recorded.move is not None:
        state += f", {recorded.move}"
    if recorded.confirms is not None:
        state += f", repeats trial {recorded.confirms}"
    layout = layout_of(recorded.engine_args)
    if layout.args:
        state += f", {layout}"
    parts = [
        f"trial {trial.number:>3}",
        fmt_params(recorded.engine_args, space_names),
        f"[{state}]",
    ]
    shown = [
        f"{label} {figures[key] * scale:.{digits}f}{unit}"
        for label, key, scale, digits, unit in LINE_FIGURES
        if isinstance(figures.get(key), int | float)
    ]
    if shown:
        prefix = ">= " if trial.state.name == "PRUNED" else ""
        parts.append(prefix + ", ".join(shown))
    if (value := words_of(of_trial(trial)).trial_words(trial)) is not None:
        parts.append(value)
    if recorded.client_behind:
        parts.append("[tuner's client fell behind: not ranked]")
    if recorded.reason:
        parts.append(f"({recorded.reason[:160]})")
    lag_s = figures.get("client_lag_max_s", 0.0)
    if lag_s > LOOP_LAG_WARNING_S:
        parts.append(f"(tuner's client ran up to {lag_s:.2f} s late: latencies include that)")
    engine_s = recorded.timings_s.get(ENGINE_START_S)
    if engine_s is not None:
        parts.append(f"start {engine_s:.0f} s")
    return "  ".join(parts)


def overhead_summary(study: optuna.Study, first: int) -> str:
    """How much of this run's trial time was not measurement, and the engine start-up times."""
    recorded = (TrialRecord.of(t) for t in study.get_trials(deepcopy=False)[first:])
    trials = [r for r in recorded if TRIAL_S in r.timings_s]
    if not trials:
        return "no trial timings recorded"
    total_s = sum(r.timings_s[TRIAL_S] for r in trials)
    window_s = sum(r.timings_s.get(WINDOW_S, 0.0) for r in trials)
    starts = sorted(r.timings_s[ENGINE_START_S] for r in trials if ENGINE_START_S in r.timings_s)
    prime_s = sum(
        float(p["prefix_prime_s"])
        for r in trials
        for p in r.points
        if isinstance(p.get("prefix_prime_s"), int | float)
    )
    primed = f" (priming the prefix cache {prime_s:.0f} s)" if prime_s >= 0.5 else ""
    text = (
        f"trial time {total_s:.0f} s, of which measurement {window_s:.0f} s{primed}: "
        f"overhead {1 - window_s / total_s:.0%}"
    )
    if starts:
        text += f"; engine start median {starts[len(starts) // 2]:.1f} s (min {starts[0]:.1f} s)"
    said = [r.compile_cache_hit for r in trials]
    hits = [bool(hit) for hit in said if hit is not None]
    if hits:
        text += f"; vLLM's compile cache hit in {sum(hits)} of {len(hits)} starts"
    return text


def comparison_table(
    chosen: Mapping[str, Any],
    other: Mapping[str, Any] | None,
    labels: tuple[str, str] = ("best", "baseline"),
    capacity_rows: Sequence[tuple[str, str, str]] = (),
) -> str:
    """The chosen trial's headline figures beside another's (the baseline's, or where the
    defaults are kept, the closest searched configuration's), as printed after a run."""
    mine, theirs = labels
    rows = [f"{'':<16} {mine:>16} {theirs:>16}"]
    rows += [f"{name:<16} {a:>16} {b:>16}" for name, a, b in capacity_rows]
    if capacity_rows:
        rows.append(f"at each one's {capacity_rows[0][0]} (else at the lowest rate it tried):")
    for name, key, scale, unit in HEADLINE:
        base = format_figure(other, key, scale, unit) if other else "n/a"
        rows.append(f"{name:<16} {format_figure(chosen, key, scale, unit):>16} {base:>16}")
    return "\n".join(rows)


def said_result(
    args: argparse.Namespace, name: str, study: optuna.Study, written: Written | None
) -> int:
    """Say which configuration was written, and why, or why none was; the exit status that
    says it.

    Exit 0 (a tuned configuration: it beats the baseline beyond chance on fresh engines), 4
    (the baseline kept), 3 (a searched configuration that meets the SLOs where the baseline
    did not, unconfirmed; or nothing met the SLOs: the closest is written) or 1 (no trial
    served: nothing written).
    """
    if written is None:
        _nothing_served(study)
        return EXIT_FAILED
    chosen, out = written.trial, written.path
    print(comparison_table(written.figures, written.other, written.labels, written.rows))
    if written.lines:
        print("\n".join(written.lines))
    serve = f"(serve: {written.serve or command_to_serve(str(out))})"
    outcome = written.choice.outcome
    if outcome == TUNED:
        print(f"tuned: trial {chosen.number}; wrote {out} {serve}")
    elif outcome == DEFAULTS:
        kept = TrialRecord.of(written.choice.group.first)
        them = "it" if kept.spec_baseline else "them"
        print(f"{kept.baseline_name} kept (trial {chosen.number}); wrote {them} to {out} {serve}")
    elif written.choice.unconfirmed or written.verdict.meets_slos:
        # The baseline misses the SLOs; the finalist met them but was not confirmed better.
        print(f"\nnot confirmed: {written.choice.why}; wrote it, trial {chosen.number}, to {out}")
    else:
        print(f"\nno trial met the SLOs; wrote the closest, trial {chosen.number}, to {out}:")
        print("\n".join(f"  {line}" for line in verdict_lines(written.verdict)))
        capacity_run = (
            f"tuner run --trace {args.trace} --study {name}-capacity --objective capacity"
        )
        print("\n".join(written.next_steps(spec_path(args, name), capacity_run)))
    return OUTCOME_EXITS[outcome]


def _nothing_served(study: optuna.Study) -> None:
    """Say why nothing is written: the first trial that failed, and its reason."""
    print(
        f"tuner: no trial served the window; nothing written. First failure: "
        f"{first_failure_words(study)}",
        file=sys.stderr,
    )


def first_failure_words(study: optuna.Study) -> str:
    """``trial 0: vLLM exited with status 1``: the study's first failed trial and its reason."""
    failed = picks.first_failure(study)
    if failed is None:
        return "none; no trial has finished its window"
    return f"trial {failed.number}: {TrialRecord.of(failed).reason or 'no reason kept'}"
