"""The ``tuner`` command line: builds the study from its inputs and reports what it found.

Only this module prints and chooses exit codes. ``tuner run`` exits 0 when it wrote a
configuration that meets the SLOs, 3 when it wrote the one that came closest but misses them,
1 when no trial served the window (nothing written) or the tool failed, 2 on bad input or usage,
130 when interrupted. The other commands exit 0, 1 or 2 alike.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import tuner
from tuner import (
    compile_key,
    concurrency,
    environment,
    from_prometheus,
    scoring,
    search,
    traffic,
    traffic_plot,
)
from tuner.concurrency import ClosedLoop, ConcurrencyTrace, LengthSource, load_concurrency
from tuner.dummy_model import write_model
from tuner.emit import HEADLINE, Provenance, format_figure, render, verdict_lines
from tuner.engine import Launcher, ProcessLauncher, ZygoteLauncher
from tuner.errors import InputError, TunerError
from tuner.formats import (
    CONCURRENCY,
    PARSERS,
    TIME_UNITS_PER_S,
    detect_format,
    load_trace,
    parse_column_mapping,
)
from tuner.outcome import Offered, next_steps
from tuner.progress import StatusLine
from tuner.replay import LOOP_LAG_WARNING_S, ReplaySettings
from tuner.spec import StudySpec, capture_pin, default_spec_text, load_spec
from tuner.trace import Request, Trace, busiest_window_start
from tuner.trial import Objective, TrialSetup
from tuner.workload import Workload, build_workload, model_info

logger = logging.getLogger("tuner")

WORKLOAD_ATTR = "workload"

# Exit codes. ``tuner run``: a configuration was written that meets the SLOs, or one that misses
# them (the closest trial), or nothing was written. Then bad input, and Ctrl-C or SIGTERM.
EXIT_MEETS_SLOS = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_MISSES_SLOS = 3
EXIT_INTERRUPTED = 130


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tuner", description=tuner.__doc__)
    parser.add_argument("--version", action="version", version=f"tuner {tuner.__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log tuner's steps")
    commands = parser.add_subparsers(dest="command", required=True)

    run = commands.add_parser("run", help="tune vLLM against a replayed trace")
    run.add_argument("--trace", required=True, type=Path, help="trace file (CSV)")
    _add_trace_options(run)
    run.add_argument("--study", help="study name (default: the trace file's stem)")
    run.add_argument("--spec", type=Path, help="study spec (default: studies/NAME.yaml)")
    run.add_argument("--model", help="model folder, written into a new spec")
    run.add_argument("--n-trials", type=int, help="trials to add in this run (default: spec)")
    run.add_argument("--storage", help="Optuna storage URL (default: sqlite:///studies/NAME.db)")
    run.add_argument(
        "--time-budget-s",
        type=float,
        help="start no trial that would end later than this many seconds from now",
    )
    run.add_argument("--window-s", type=float, help="replay window in trace seconds")
    run.add_argument("--time-scale", type=float, help="multiply arrival times (< 1 is faster)")
    run.add_argument("--configs", type=Path, default=Path("configs"), help="output folder")
    run.add_argument("--runs", type=Path, default=Path("runs"), help="trial logs folder")
    run.add_argument(
        "--lengths-trace", type=Path, help="request trace whose lengths a concurrency trace draws"
    )
    run.add_argument(
        "--input-lengths", help="prompt lengths for a concurrency trace: uniform:10:200"
    )
    run.add_argument("--output-lengths", help="output lengths for a concurrency trace")
    run.add_argument(
        "--launcher",
        choices=("auto", "process", "zygote"),
        default="auto",
        help="process: a fresh interpreter per trial; zygote: import vLLM's server once and "
        "fork one per trial (faster starts); auto (default): zygote, except on vLLM's CPU "
        "build (see README)",
    )
    _add_trace_commands(commands)
    keys = commands.add_parser(
        "compile-key",
        help="which searched engine arguments change vLLM's compile key (the installed vLLM's)",
    )
    keys.add_argument("--spec", type=Path, required=True, help="study spec")
    return parser


def _add_trace_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--format", choices=sorted(PARSERS), help="trace format (default: detect)")
    parser.add_argument(
        "--columns",
        type=_column_mapping,
        help="columns of any CSV/JSONL: timestamp=ts,input_tokens=in,output_tokens=out",
    )
    parser.add_argument(
        "--time-unit", choices=sorted(TIME_UNITS_PER_S), default="s", help="of --columns timestamps"
    )
    parser.add_argument("--trace-model", help="keep only this model's rows (BurstGPT)")


def _column_mapping(text: str) -> dict[str, str]:
    try:
        return parse_column_mapping(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _length_source(args: argparse.Namespace) -> LengthSource:
    """Where a closed-loop replay draws its request lengths from."""
    if args.lengths_trace:
        return LengthSource.from_trace(load_trace(args.lengths_trace))
    if args.input_lengths and args.output_lengths:
        return LengthSource.from_distributions(args.input_lengths, args.output_lengths)
    raise InputError(
        f"{args.trace} is a concurrency trace: give request lengths with --lengths-trace FILE "
        "or --input-lengths and --output-lengths (fixed:N, uniform:LO:HI, lognormal:MEDIAN:SIGMA)"
    )


def trace_options(args: argparse.Namespace) -> dict[str, Any]:
    """The keyword arguments of ``load_trace`` that the trace options give."""
    return {"columns": args.columns, "time_unit": args.time_unit, "model": args.trace_model}


def _add_trace_commands(commands: Any) -> None:
    trace = commands.add_parser("trace", help="look at a trace, or rebuild one from Prometheus")
    sub = trace.add_subparsers(dest="trace_command", required=True)
    inspect = sub.add_parser("inspect", help="the shape of a trace's traffic")
    inspect.add_argument("file", type=Path, help="request trace or concurrency trace")
    _add_trace_options(inspect)
    inspect.add_argument("--json", action="store_true", help="print the figures as JSON")
    inspect.add_argument("--png", type=Path, help="plot file (default: STEM-inspect.png)")
    inspect.add_argument("--no-png", action="store_true", help="write no plot")
    inspect.add_argument("--window-s", type=float, default=60.0, help="tuner run's window")
    inspect.add_argument("--tpot-ms", type=float, default=30.0, help="service model: decode")
    inspect.add_argument(
        "--prefill-tokens-per-s", type=float, default=8000.0, help="service model: prefill"
    )
    rebuild = sub.add_parser("from-prometheus", help="rebuild a trace from vLLM's metrics")
    rebuild.add_argument("--url", required=True, help="Prometheus base URL")
    rebuild.add_argument("--start", required=True, help="epoch seconds or ISO 8601 (UTC)")
    rebuild.add_argument("--end", required=True, help="epoch seconds or ISO 8601 (UTC)")
    rebuild.add_argument("--selector", default="", help='label matchers, e.g. job="vllm"')
    rebuild.add_argument("--step-s", type=float, default=15.0, help="query resolution")
    rebuild.add_argument("--seed", type=int, default=0, help="for arrivals and lengths")
    rebuild.add_argument("--out", type=Path, default=Path("prometheus-trace.csv"))
    rebuild.add_argument("--concurrency-out", type=Path, help="default: OUT.concurrency.csv")


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _interrupt(signum: int, frame: object) -> NoReturn:
    raise KeyboardInterrupt


def _fmt_params(args: Mapping[str, Any], space_names: Sequence[str]) -> str:
    shown = {k: v for k, v in args.items() if k in space_names} or {"(vLLM defaults)": ""}
    # None: left to vLLM's default (a field of a nested config such as the capture range).
    return " ".join(
        f"{k}={'default' if v is None else v}" if v != "" else k for k, v in shown.items()
    )


# What a trial's progress line shows: label, user attribute, scale, decimals, unit.
LINE_FIGURES = (
    ("ttft p95", "ttft_p95_s", 1000, 0, " ms"),
    ("tpot p95", "tpot_p95_s", 1000, 1, " ms"),
    ("e2e p99", "e2e_p99_s", 1, 2, " s"),
    ("throughput", "throughput_req_per_s", 1, 2, " req/s"),
    ("queue peak", "waiting_peak", 1, 0, ""),
)


def _trial_line(trial: Any, space_names: Sequence[str]) -> str:
    attrs = trial.user_attrs
    args = attrs.get(search.ARGS_ATTR, {})
    state = "feasible" if attrs.get(search.FEASIBLE_ATTR) else "infeasible"
    if trial.state.name == "PRUNED":
        state = "pruned"
    if search.BASELINE_ATTR in attrs:
        state += ", baseline"
    parts = [f"trial {trial.number:>3}", _fmt_params(args, space_names), f"[{state}]"]
    shown = [
        f"{label} {attrs[key] * scale:.{digits}f}{unit}"
        for label, key, scale, digits, unit in LINE_FIGURES
        if isinstance(attrs.get(key), int | float)
    ]
    if shown:
        prefix = ">= " if trial.state.name == "PRUNED" else ""
        parts.append(prefix + ", ".join(shown))
    if trial.value is not None:
        parts.append(f"score {trial.value:.3f}")
    if attrs.get(search.REASON_ATTR):
        parts.append(f"({attrs[search.REASON_ATTR][:160]})")
    lag_s = attrs.get("client_lag_max_s", 0.0)
    if lag_s > LOOP_LAG_WARNING_S:
        parts.append(f"(tuner's client ran up to {lag_s:.2f} s late: latencies include that)")
    engine_s = attrs.get("time_engine_healthy_s")
    if engine_s is not None:
        parts.append(f"start {engine_s:.0f} s")
    return "  ".join(parts)


def overhead_summary(study: Any, first: int) -> str:
    """How much of this run's trial time was not measurement, and the engine start-up times."""
    trials = [t for t in study.get_trials(deepcopy=False)[first:] if "time_trial_s" in t.user_attrs]
    if not trials:
        return "no trial timings recorded"
    total_s = sum(t.user_attrs["time_trial_s"] for t in trials)
    window_s = sum(t.user_attrs.get("time_window_s", 0.0) for t in trials)
    starts = sorted(
        t.user_attrs["time_engine_healthy_s"]
        for t in trials
        if "time_engine_healthy_s" in t.user_attrs
    )
    text = (
        f"trial time {total_s:.0f} s, of which measurement {window_s:.0f} s: "
        f"overhead {1 - window_s / total_s:.0%}"
    )
    if starts:
        text += f"; engine start median {starts[len(starts) // 2]:.1f} s (min {starts[0]:.1f} s)"
    hits = [t.user_attrs.get("compile_cache_hit") for t in trials]
    hits = [hit for hit in hits if hit is not None]
    if hits:
        text += f"; vLLM's compile cache hit in {sum(hits)} of {len(hits)} starts"
    return text


def comparison_table(
    chosen: Mapping[str, Any], baseline: Mapping[str, Any] | None, label: str = "best"
) -> str:
    rows = [f"{'':<16} {label:>14} {'baseline':>14}"]
    for name, key, scale, unit in HEADLINE:
        base = format_figure(baseline, key, scale, unit) if baseline else "n/a"
        rows.append(f"{name:<16} {format_figure(chosen, key, scale, unit):>14} {base:>14}")
    return "\n".join(rows)


def _check_workload(study: Any, fingerprint: Mapping[str, Any]) -> None:
    recorded = study.user_attrs.get(WORKLOAD_ATTR)
    if recorded is None:
        study.set_user_attr(WORKLOAD_ATTR, dict(fingerprint))
    elif recorded != dict(fingerprint):
        raise InputError(
            f"study {study.study_name!r} was measured on another workload "
            f"({recorded}); use a new --study name"
        )


@dataclass
class Replay:
    """What every trial of a run replays: an open-loop window or a closed-loop schedule."""

    requests: list[Request]
    closed_loop: ClosedLoop | None
    block_tokens: int
    fingerprint: dict[str, Any]
    text: str
    # What an open-loop window asks of a server; None for a closed loop.
    offered: Offered | None = None


def _spec_path(args: argparse.Namespace, name: str) -> Path:
    return args.spec or Path("studies") / f"{name}.yaml"


def _load_spec(args: argparse.Namespace, name: str, trace: Trace | None) -> StudySpec:
    """The study spec, written with the defaults when absent; its dummy model, if it has one.

    Off vLLM's CPU build, the defaults search the CUDA-graph capture range, over values that
    cover the trace's prompt lengths.
    """
    spec_path = _spec_path(args, name)
    if not spec_path.exists():
        spec_path.parent.mkdir(parents=True, exist_ok=True)
        prompts = None if trace is None else [int(n) for n in trace.input_tokens]
        gpu = not environment.is_cpu_build()
        spec_path.write_text(default_spec_text(args.model, gpu=gpu, prompt_tokens=prompts))
        print(f"wrote a default study spec to {spec_path}")
    spec = load_spec(spec_path)
    if args.model and args.model != spec.model:
        raise InputError(f"--model {args.model} differs from {spec_path}'s model {spec.model}")
    if spec.dummy_model and not Path(spec.model, "config.json").exists():
        write_model(spec.model, spec.dummy_model)
        print(f"wrote a {spec.dummy_model} dummy model to {spec.model}")
    return spec


def _closed_loop_replay(
    args: argparse.Namespace,
    schedule: ConcurrencyTrace,
    lengths: LengthSource,
    window_s: float,
    time_scale: float,
    max_model_len: int,
) -> Replay:
    start_s = concurrency.busiest_window_start(schedule, window_s)
    window = schedule.window(start_s, window_s).scaled(time_scale)
    lengths_from = (
        sha256_of(args.lengths_trace)
        if args.lengths_trace
        else f"{args.input_lengths} {args.output_lengths}"
    )
    return Replay(
        requests=[],
        closed_loop=ClosedLoop(window, lengths, max_model_len),
        block_tokens=0,
        fingerprint={"window_start_s": start_s, "closed_loop": True, "lengths": lengths_from},
        text=(
            f"closed loop from {start_s:.1f} s of the concurrency trace, {window.span_s:.1f} s, "
            f"up to {int(window.concurrency.max(initial=0))} in flight (time scale {time_scale:g})"
        ),
    )


def _open_loop_replay(
    trace: Trace, window_s: float, time_scale: float, max_model_len: int
) -> Replay:
    workload: Workload = build_workload(trace, window_s, time_scale, max_model_len)
    clip = workload.clipping
    if clip.inputs_clipped or clip.outputs_clipped:
        print(
            f"clipped to the model's {max_model_len}-token context: "
            f"{clip.inputs_clipped} prompts, {clip.outputs_clipped} outputs"
        )
    return Replay(
        requests=workload.trace.requests(),
        closed_loop=None,
        block_tokens=trace.block_tokens,
        fingerprint={"window_start_s": workload.start_s, "requests": len(workload.trace)},
        text=workload.describe(),
        offered=Offered(len(workload.trace), workload.replay_s),
    )


def _launcher(choice: str, log: Path) -> Launcher:
    kind = choice
    if kind == "auto":
        kind = "process" if environment.is_cpu_build() else "zygote"
    print(f"launcher: {kind}" + (" (auto)" if choice == "auto" else ""))
    return ZygoteLauncher(log=log) if kind == "zygote" else ProcessLauncher()


def _write_result(
    args: argparse.Namespace, study: Any, spec: StudySpec, name: str, sha: str, replay: Replay
) -> int:
    """Write the best trial that met the SLOs, else the closest that served; say which.

    Exit 0 (meets the SLOs), 3 (written, misses them) or 1 (no trial served: nothing written).
    """
    chosen = search.best_trial(study) or search.closest_trial(study)
    if chosen is None:
        failed = search.first_failure(study)
        why = (
            f"trial {failed.number}: {failed.user_attrs.get(search.REASON_ATTR, 'no reason kept')}"
            if failed is not None
            else "none; no trial has finished its window"
        )
        print(
            f"tuner: no trial served the window; nothing written. First failure: {why}",
            file=sys.stderr,
        )
        return EXIT_FAILED
    verdict = scoring.verdict(search.constraints_of(chosen), chosen.user_attrs)
    baseline = search.baseline_trial(study)
    baseline_attrs = baseline.user_attrs if baseline else None
    label = "best" if verdict.meets_slos else "closest"
    print(comparison_table(chosen.user_attrs, baseline_attrs, label))
    provenance = Provenance(
        tuner_version=tuner.__version__,
        vllm_version=environment.vllm_version(),
        device=environment.device_name(),
        study=name,
        trace_path=str(args.trace),
        trace_sha256=sha,
        window=replay.text,
        trial_number=chosen.number,
    )
    text = render(
        spec.model,
        search.engine_args_of(chosen),
        provenance,
        verdict,
        chosen.user_attrs,
        baseline_attrs,
    )
    args.configs.mkdir(parents=True, exist_ok=True)
    out = args.configs / f"{name}.yaml"
    out.write_text(text)
    if verdict.meets_slos:
        print(f"best: trial {chosen.number}; wrote {out} (serve: vllm serve --config {out})")
        return EXIT_MEETS_SLOS
    print(f"\nno trial met the SLOs; wrote the closest, trial {chosen.number}, to {out}:")
    print("\n".join(f"  {line}" for line in verdict_lines(verdict)))
    steps = next_steps(chosen.number, chosen.user_attrs, replay.offered, _spec_path(args, name))
    print("\n".join(steps))
    return EXIT_MISSES_SLOS


def cmd_run(args: argparse.Namespace) -> int:
    name = args.study or args.trace.stem
    if args.n_trials is not None and args.n_trials < 0:
        raise InputError(f"--n-trials must be 0 or more, got {args.n_trials}")
    # Bad input stops here, before anything is written.
    if (args.format or detect_format(args.trace)) == CONCURRENCY:
        trace = None
        schedule, lengths = load_concurrency(args.trace), _length_source(args)
        print(f"concurrency trace {args.trace}: {len(schedule.time_s)} samples")
    else:
        trace = load_trace(args.trace, args.format, **trace_options(args))
        print(f"trace {args.trace}: {len(trace)} requests over {trace.span_s:.0f} s")
    spec = _load_spec(args, name, trace)
    max_len = spec.engine_args.get("max-model-len")
    info = model_info(spec.model, int(max_len) if max_len else None)
    window_s = args.window_s or spec.window_s
    time_scale = args.time_scale or spec.time_scale
    if trace is None:
        replay = _closed_loop_replay(
            args, schedule, lengths, window_s, time_scale, info.max_model_len
        )
    else:
        replay = _open_loop_replay(trace, window_s, time_scale, info.max_model_len)
    print(f"window: {replay.text}")

    sha = sha256_of(args.trace)
    storage = args.storage or f"sqlite:///studies/{name}.db"
    study = search.open_study(name, storage, spec.seed, search.pruner_for(spec))
    workload = {"trace_sha256": sha, "window_s": window_s, "time_scale": time_scale}
    _check_workload(study, workload | replay.fingerprint)
    n_trials = spec.n_trials if args.n_trials is None else args.n_trials
    print(f"study {name!r} in {storage}: {len(study.trials)} trials so far, adding {n_trials}")
    if n_trials:
        _run_trials(args, study, spec, name, info.vocab_size, replay, n_trials)
    print(f"\ndashboard: optuna-dashboard {storage}")
    return _write_result(args, study, spec, name, sha, replay)


def _run_trials(
    args: argparse.Namespace,
    study: Any,
    spec: StudySpec,
    name: str,
    vocab_size: int,
    replay: Replay,
    n_trials: int,
) -> None:
    launcher = _launcher(args.launcher, args.runs / name / "launcher.log")
    # On a terminal, a live line shows the running trial; elsewhere, one line as each starts.
    status = StatusLine(sys.stdout)
    space_names = [d.name for d in spec.space]

    def started(number: int, engine_args: Mapping[str, Any]) -> None:
        params = _fmt_params(engine_args, space_names)
        if status.live:
            status.begin(number, params)
        else:
            print(f"trial {number:>3}  {params}  starting vLLM ...", flush=True)

    def finished(trial: Any) -> None:
        status.clear()
        print(_trial_line(trial, space_names), flush=True)

    setup = TrialSetup(
        model=spec.model,
        requests=replay.requests,
        replay=ReplaySettings(
            model=str(spec.engine_args.get("served-model-name", spec.model)),
            vocab_size=vocab_size,
            block_tokens=replay.block_tokens,
            seed=spec.seed,
        ),
        objective=Objective(spec.slos, spec.weights, spec.max_error_rate),
        health_timeout_s=spec.health_timeout_s,
        warmup_requests=replay.requests[: spec.warmup_requests],
        launcher=launcher,
        closed_loop=replay.closed_loop,
        progress=status.show if status.live else None,
    )
    first_new = len(study.trials)
    deadline = time.monotonic() + args.time_budget_s if args.time_budget_s else None
    pinned = capture_pin(spec, environment.is_cpu_build())
    for key, value in pinned.items():
        print(f"pinned after trial 0, so that trials share vLLM's compiles: {key}={value}")
    log_handlers = logging.getLogger().handlers
    for handler in log_handlers:
        handler.addFilter(status.before_log)
    try:
        ran = search.run_study(
            study,
            spec,
            setup,
            args.runs / name,
            n_trials,
            on_trial=finished,
            on_start=started,
            deadline=deadline,
            pinned=pinned,
        )
        if ran < n_trials:
            print(f"time budget reached: ran {ran} of {n_trials} trials")
    finally:
        # Interrupted: the line stays, showing where the trial was.
        status.keep()
        for handler in log_handlers:
            handler.removeFilter(status.before_log)
        launcher.close()
    print(overhead_summary(study, first_new))


def cmd_trace_inspect(args: argparse.Namespace) -> int:
    service = traffic.ServiceModel(args.prefill_tokens_per_s, args.tpot_ms / 1000)
    if service.prefill_tokens_per_s <= 0 or service.tpot_s <= 0 or args.window_s <= 0:
        raise InputError("--window-s, --tpot-ms and --prefill-tokens-per-s must be positive")
    fmt = args.format or (None if args.columns else detect_format(args.file))
    png = None if args.no_png else args.png or Path(f"{args.file.stem}-inspect.png")
    if fmt == CONCURRENCY:
        schedule = load_concurrency(args.file)
        profile = traffic.profile_concurrency(schedule)
        if png:
            traffic_plot.plot_concurrency(schedule, png)
    else:
        trace = load_trace(args.file, fmt, **trace_options(args))
        profile = traffic.profile_trace(trace, args.window_s, service)
        if png:
            window = (busiest_window_start(trace, args.window_s), args.window_s)
            traffic_plot.plot_trace(trace, png, window, service)
    if args.json:
        print(json.dumps(profile | {"png": str(png) if png else None}, indent=2))
    else:
        print(traffic.format_profile(profile))
        if png:
            print(f"{'plot':<18} {png}")
    return 0


def cmd_trace_from_prometheus(args: argparse.Namespace) -> int:
    start_s = from_prometheus.parse_time(args.start)
    end_s = from_prometheus.parse_time(args.end)
    scraped = from_prometheus.fetch(args.url, start_s, end_s, args.step_s, args.selector)
    rebuilt = from_prometheus.rebuild(scraped, args.seed)
    concurrency_out = args.concurrency_out or args.out.with_suffix(".concurrency.csv")
    from_prometheus.write_trace(args.out, rebuilt)
    from_prometheus.write_concurrency(concurrency_out, rebuilt)
    trace = rebuilt.trace
    print(f"wrote {args.out}: {len(trace)} requests over {trace.span_s:.0f} s")
    print(f"wrote {concurrency_out}: {len(rebuilt.concurrency)} samples of the running requests")
    return 0


def cmd_compile_key(args: argparse.Namespace) -> int:
    """Hash each searched dimension's values with vLLM's own config hashing, as the searched
    trials run them (with the pinned capture range, if any), and without the pin."""
    spec = load_spec(args.spec)
    if spec.dummy_model and not Path(spec.model, "config.json").exists():
        write_model(spec.model, spec.dummy_model)
    pinned = capture_pin(spec, environment.is_cpu_build())
    variants = {"searched trials": {**spec.engine_args, **pinned}}
    if pinned:
        pins = ", ".join(f"{k}={v}" for k, v in pinned.items())
        variants = {f"searched trials ({pins})": variants["searched trials"]}
        variants["without the pin"] = dict(spec.engine_args)
    found = compile_key.key_dependence(spec.model, list(variants.values()), spec.space)
    print(f"vLLM {environment.vllm_version()}: VllmConfig.compute_hash() at each dimension's ends")
    for label, dependences in zip(variants, found, strict=True):
        print(f"{label}:")
        for dep in dependences:
            verdict = "changes the key" if dep.changes_key else "same key"
            values = ", ".join("default" if v is None else str(v) for v in dep.values)
            keys = ", ".join(k[:10] for k in dep.keys)
            print(f"  {dep.name:<46} {verdict:<16} {values}: {keys}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        if args.command == "trace":
            if args.trace_command == "inspect":
                return cmd_trace_inspect(args)
            return cmd_trace_from_prometheus(args)
        if args.command == "compile-key":
            return cmd_compile_key(args)
        return cmd_run(args)
    except InputError as exc:
        print(f"tuner: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except TunerError as exc:
        print(f"tuner: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print("\ntuner: interrupted; the study keeps its finished trials", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
