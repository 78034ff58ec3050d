"""``tuner run``: measure configurations against the replayed trace, write the best."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tuner.cli.inputs import check_workload, length_source, sha256_of, spec_path
from tuner.cli.output import check_writable, write_whole
from tuner.cli.parser import trace_options
from tuner.cli.progress import StatusLine
from tuner.cli.report import after_run
from tuner.cli.result import fmt_params, overhead_summary, trial_line, write_result
from tuner.engine import arguments, environment
from tuner.engine.launchers import AUTO as AUTO_LAUNCHER
from tuner.engine.launchers import LAUNCHERS, Launcher, auto_launcher
from tuner.errors import InputError, TunerError
from tuner.flags import LOAD_FORMAT, RANDOM_WEIGHTS, random_weights
from tuner.study.measure import calibrate
from tuner.study.measure.objective import of_spec
from tuner.study.measure.prepare import (
    Replay,
    closed_loop_replay,
    model_of,
    open_loop_replay,
    trial_setup,
    write_dummy_model,
)
from tuner.study.plan.space import capture_pin, default_spec_text, runnable_baseline
from tuner.study.plan.spec import AUTO, StudySpec, load_spec, parse_spec
from tuner.study.plan.spec_file import read_spec_document
from tuner.study.trials import confirm, fingerprint, search
from tuner.study.trials.budget import ENGINE_START_GUESS_S, Budget, confirm_trials
from tuner.study.trials.groups import any_feasible, groups
from tuner.study.trials.workers import fail_orphans
from tuner.traces.concurrency import ConcurrencyTrace, LengthSource, load_concurrency
from tuner.traces.formats import CONCURRENCY, decide_format, load_trace
from tuner.traces.model import Trace
from tuner.traces.workload import ModelInfo, model_info


def spec_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """What the command line sets in the spec: its SLOs (each weighted 1) and objective."""
    out: dict[str, Any] = {}
    if args.slo:
        out["slos"] = dict(args.slo)
        out["objective"] = dict.fromkeys(out["slos"], 1.0)
    if args.objective is not None:
        out["objective_mode"] = args.objective
    return out


def write_default_spec(args: argparse.Namespace, path: Path, trace: Trace | None) -> None:
    """The spec for this trace, model and machine, with the command line's settings.

    Off vLLM's CPU build, max-num-seqs reaches vLLM's default on the GPU vLLM will open first,
    and the defaults search the CUDA-graph capture range, over values that cover the trace's
    prompt lengths. On it, gpu-memory-utilization is searched up to what this machine starts.
    A ``--model`` that cannot be read is an ``InputError`` before anything is written.
    """
    if args.model:
        model_info(args.model, None)
    path.parent.mkdir(parents=True, exist_ok=True)
    prompts = None if trace is None else [int(n) for n in trace.input_tokens]
    gpu = not environment.is_cpu_build()
    device = next(iter(environment.visible_gpus()), None) if gpu else None
    memory = None if gpu else environment.host_memory()
    text = default_spec_text(
        args.model,
        gpu=gpu,
        prompt_tokens=prompts,
        device=device,
        cpu_memory=memory,
        dummy_weights=args.dummy_weights,
        overrides=spec_overrides(args),
    )
    write_whole(path, text)


def load_study_spec(args: argparse.Namespace, name: str, trace: Trace | None) -> StudySpec:
    """The study spec, written when absent, with the command line's settings over it; its
    dummy model written, if it has one."""
    path = spec_path(args, name)
    if not path.exists():
        write_default_spec(args, path, trace)
        print(f"wrote a default study spec to {path}")
    document = read_spec_document(path)
    if isinstance(document, dict):
        document = {**document, **spec_overrides(args)}
    spec = parse_spec(document, str(path))
    if args.model and args.model != spec.model:
        raise InputError(f"--model {args.model} differs from {path}'s model {spec.model}")
    if args.dummy_weights and not random_weights(spec.engine_args):
        spec = dataclasses.replace(
            spec, engine_args={**spec.engine_args, LOAD_FORMAT: RANDOM_WEIGHTS}
        )
    if random_weights(spec.engine_args):
        print(
            "measuring on random weights (load-format dummy); the configuration written "
            "leaves that out, to serve the model's weights"
        )
    if write_dummy_model(spec):
        weights = "none saved" if random_weights(spec.engine_args) else "saved"
        print(f"wrote a {spec.dummy_model} model to {spec.model} (random weights, {weights})")
    return spec


def cmd_init(args: argparse.Namespace) -> int:
    """``tuner init``: write the study spec for this trace, model and machine; run nothing."""
    name = args.study or args.trace.stem
    trace = None
    if decide_format(args.trace, args.format, args.columns) != CONCURRENCY:
        trace = load_trace(args.trace, args.format, **trace_options(args))
    path = spec_path(args, name)
    if path.exists():
        raise InputError(f"{path} exists: edit it, or give another --study or --spec")
    write_default_spec(args, path, trace)
    load_spec(path)
    print(f"wrote {path}: read it, edit it, then: tuner run --trace {args.trace} --study {name}")
    return 0


def check_engine_arguments(spec: StudySpec, path: Path) -> None:
    """An ``InputError`` for an engine argument the installed vLLM does not accept."""
    known = arguments.known_arguments()
    if known is None:
        return
    names = [*spec.engine_args, *spec.baseline, *(d.name for d in spec.space)]
    names += [name for candidate in spec.candidates for name in candidate]
    unknown = arguments.unknown_arguments(dict.fromkeys(names), known)
    if unknown:
        name, close = next(iter(unknown.items()))
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise InputError(
            f"{path}: {name}: not an engine argument of vLLM {environment.vllm_version()}{hint}"
        )


def launcher_for(choice: str, log: Path) -> Launcher:
    """The launcher ``--launcher`` names (``LAUNCHERS``; auto: ``auto_launcher``), said on
    stdout."""
    kind = auto_launcher(environment.is_cpu_build()) if choice == AUTO_LAUNCHER else choice
    print(f"launcher: {kind}" + (" (auto)" if choice == AUTO_LAUNCHER else ""))
    return LAUNCHERS[kind](log)


def _calibration(
    args: argparse.Namespace,
    study: Any,
    spec: StudySpec,
    name: str,
    vocab_size: int,
    replay: Replay,
    launcher: Launcher | None,
) -> calibrate.Calibration:
    """The study's calibration: the one it holds, else measured now on vLLM's defaults (the
    study's baseline) and kept in the study."""
    held = calibrate.stored(study.user_attrs)
    if held is not None:
        return held
    if launcher is None:
        raise InputError(
            f"study {name!r} has no calibration yet (time_scale: auto): run it with trials to "
            "measure one"
        )
    assert replay.offered is not None  # an open-loop window
    search_at = calibrate.settings(
        replay.requests, replay.offered.replay_s, spec.calibrate_replay_s, spec.client_tolerance_s
    )
    print(
        "calibrating (time_scale: auto): how much of this window vLLM's defaults carry within "
        f"the SLOs on this machine, from {search_at.window_req_per_s:.3g} req/s, "
        f"{search_at.rate_window_s:g} s a rate, to within {search_at.resolution:.0%}",
        flush=True,
    )
    setup = trial_setup(spec, replay, vocab_size, launcher)
    try:
        measured = calibrate.measure(setup, search_at, spec, args.runs / name / "calibration")
    except calibrate.CalibrationFailed as exc:
        tail = f"\n{exc.log_tail}" if exc.log_tail else ""
        raise TunerError(
            f"calibration: vLLM's defaults did not serve: {exc.reason}{tail}"
        ) from None
    # Another worker of a shared study may have calibrated meanwhile: its calibration wins.
    held = calibrate.stored(study.user_attrs)
    if held is not None:
        return held
    study.set_user_attr(calibrate.CALIBRATION_ATTR, measured.as_attr())
    return measured


def cmd_run(args: argparse.Namespace) -> int:
    """``tuner run``: read the trace and the spec (writing one if there is none), calibrate where
    asked, add the trials, confirm the winner and write its configuration; the exit status says
    whether it meets the SLOs."""
    began = time.monotonic()
    name = args.study or args.trace.stem
    # Bad input stops here, before anything is written.
    trace, schedule, lengths = _read_trace(args)
    spec = load_study_spec(args, name, trace)
    n_trials = 0 if args.confirm_only else spec.n_trials if args.n_trials is None else args.n_trials
    # Whether this run starts engines: to add trials, or to finish a confirmation.
    measures = bool(n_trials or args.confirm_only)
    spec = _checked_spec(args, name, spec, trace is not None, measures)
    info = model_of(spec)
    # The parser took only positive numbers: an option given is never dropped for the spec's.
    window_s = spec.window_s if args.window_s is None else args.window_s
    # "auto": a latency study of a request trace replays at a rate calibrated on this machine,
    # once its study is open (the calibration is kept there); anything else at the trace's speed.
    calibrating = args.time_scale is None and spec.time_scale == AUTO
    calibrating = calibrating and trace is not None and of_spec(spec).calibrates
    if args.time_scale is not None:
        time_scale = args.time_scale
    else:
        time_scale = 1.0 if spec.time_scale == AUTO else float(spec.time_scale)
    replay = _replay(args, spec, (trace, schedule, lengths), window_s, time_scale, info)
    sha = sha256_of(args.trace)
    study, storage = _open_study(args, spec, name)
    # Asked once a run, and only to add trials: a report may be written on another machine.
    machine = fingerprint.measured_on() if measures else {}
    launcher = launcher_for(args.launcher, args.runs / name / "launcher.log") if measures else None
    budget = _budget(args, spec, began, replay) if measures else None
    try:
        if calibrating:
            assert trace is not None
            calibration = _calibration(args, study, spec, name, info.vocab_size, replay, launcher)
            print(calibration.describe())
            time_scale = calibration.time_scale
            replay = _said(
                open_loop_replay(
                    trace, window_s, time_scale, info.max_model_len, calibration.replay_s
                )
            )
            print(f"window: {replay.text}")
        workload = {"trace_sha256": sha, "window_s": window_s, "time_scale": time_scale}
        check_workload(study, fingerprint.of_study(spec, workload | replay.fingerprint, machine))
        print(f"study {name!r} in {storage}: {len(study.trials)} trials so far, adding {n_trials}")
        if launcher is not None:
            _run_trials(
                args, study, spec, name, info.vocab_size, replay, n_trials, machine, launcher,
                budget,
            )  # fmt: skip
    finally:
        if launcher is not None:
            launcher.close()
    print(f"\ndashboard: optuna-dashboard {storage}")
    return after_run(args, name, storage, write_result(args, study, spec, name, sha, replay))


def _budget(
    args: argparse.Namespace, spec: StudySpec, began: float, replay: Replay
) -> Budget | None:
    """The run's time budget (``--time-budget-s``, else the spec's ``time_budget_s``), counted
    from ``began`` (``time.monotonic()``), with the confirm step's measurements held back; None
    without one. Said in the output."""
    budget_s = spec.time_budget_s if args.time_budget_s is None else args.time_budget_s
    if budget_s is None:
        return None
    where = "--time-budget-s" if args.time_budget_s is not None else "the spec's time_budget_s"
    replay_s = replay.offered.replay_s if replay.offered is not None else spec.window_s
    estimate_s = ENGINE_START_GUESS_S + of_spec(spec).measure_s(spec, replay_s)
    candidates = len(spec.candidates) if spec.confirm_candidates else 0
    held = confirm_trials(spec.confirm_top_k, spec.confirm_repeats, candidates)
    print(
        f"time budget: {budget_s:g} s for the whole run ({where}); the search stops where one "
        "more trial would leave too little for the confirmation; the first trial always runs "
        "(in a new study, vLLM's defaults)"
    )
    return Budget(ends=began + budget_s, confirm_trials=held, estimate_s=estimate_s)


def _read_trace(
    args: argparse.Namespace,
) -> tuple[Trace | None, ConcurrencyTrace | None, LengthSource | None]:
    """The request trace, or (a concurrency trace) its schedule and where lengths come from."""
    if decide_format(args.trace, args.format, args.columns) == CONCURRENCY:
        schedule, lengths = load_concurrency(args.trace), length_source(args)
        print(f"concurrency trace {args.trace}: {len(schedule.time_s)} samples")
        return None, schedule, lengths
    trace = load_trace(args.trace, args.format, **trace_options(args))
    print(f"trace {args.trace}: {len(trace)} requests over {trace.span_s:.0f} s")
    return trace, None, None


def _checked_spec(
    args: argparse.Namespace, name: str, spec: StudySpec, request_trace: bool, measures: bool
) -> StudySpec:
    """The spec as this run uses it, once the folders, the engine arguments and the objective
    are checked: on vLLM's CPU build with a baseline that starts there (said), with
    ``--client-procs``."""
    check_writable(args.configs, "--configs")
    if measures:
        check_writable(args.runs, "--runs")
        check_engine_arguments(spec, spec_path(args, name))
        if environment.is_cpu_build():
            spec, note = runnable_baseline(spec, environment.host_memory())
            if note:
                print(note)
    if args.client_procs is not None:
        spec = dataclasses.replace(spec, client_procs=args.client_procs)
    of_spec(spec).check_trace(request_trace)
    return spec


def _replay(
    args: argparse.Namespace,
    spec: StudySpec,
    read: tuple[Trace | None, ConcurrencyTrace | None, LengthSource | None],
    window_s: float,
    time_scale: float,
    info: ModelInfo,
) -> Replay:
    """The window replayed, open-loop from a request trace or closed-loop from a concurrency
    one, and how (said, with the capacity search where the objective is capacity)."""
    trace, schedule, lengths = read
    if trace is None:
        assert schedule is not None and lengths is not None
        lengths_from = (
            sha256_of(args.lengths_trace)
            if args.lengths_trace
            else f"{args.input_lengths} {args.output_lengths}"
        )
        replay = closed_loop_replay(
            schedule, lengths, lengths_from, window_s, time_scale, info.max_model_len
        )
    else:
        replay = _said(open_loop_replay(trace, window_s, time_scale, info.max_model_len))
    print(f"window: {replay.text}")
    said = of_spec(spec).measure(spec, replay.requests, replay.offered).describe()
    if said:
        print(said)
    return replay


def _said(replay: Replay) -> Replay:
    """The replay, once what was clipped to the model's context is said."""
    if replay.clipped:
        print(replay.clipped)
    return replay


def _open_study(args: argparse.Namespace, spec: StudySpec, name: str) -> tuple[Any, str]:
    """The study and its storage URL; trials whose tuner is gone are marked failed (said)."""
    storage = args.storage
    if storage is None:
        # The default storage's folder, made here as the default spec's is: a spec given
        # elsewhere leaves it missing. A URL given is used as given; a folder missing there is
        # more likely a slip, and the error names it.
        Path("studies").mkdir(exist_ok=True)
        storage = f"sqlite:///studies/{name}.db"
    study = search.open_study(
        name, storage, spec.seed, search.pruner_for(spec), objective=of_spec(spec)
    )
    for orphan in fail_orphans(study):
        print(f"trial {orphan.number}: its tuner is gone (killed or crashed); marked failed")
    return study, storage


class _TrialLines:
    """What ``tuner run`` prints of each trial: on a terminal a live line shows the running
    trial; elsewhere one line as each starts, once its vLLM process has been started:
    ``trial   3  max-num-seqs=12  starting vLLM (pid 4321) ...`` (that pid is also the server's
    process group); a summary line as each ends."""

    def __init__(self, spec: StudySpec) -> None:
        self.status = StatusLine(sys.stdout)
        # What a trial's line names: the searched arguments, and what the baseline and the
        # candidates set beyond the fixed ones (a candidate {api-server-count: 2} is not the
        # defaults).
        set_by = [*spec.baseline, *(name for candidate in spec.candidates for name in candidate)]
        self.names = list(dict.fromkeys([*(d.name for d in spec.space), *set_by]))
        # The trial starting and its engine arguments, until its start line is printed.
        self._starting: tuple[int, str] | None = None

    def started(self, number: int, engine_args: Mapping[str, Any]) -> None:
        params = fmt_params(engine_args, self.names)
        if self.status.live:
            self.status.begin(number, params)
        else:
            self._starting = (number, params)

    def engine_started(self, pid: int) -> None:
        """Off a terminal, the start line, now that the trial's vLLM process has been started."""
        if self._starting is not None:
            (number, params), self._starting = self._starting, None
            print(f"trial {number:>3}  {params}  starting vLLM (pid {pid}) ...", flush=True)

    def finished(self, trial: Any) -> None:
        self.status.clear()
        print(trial_line(trial, self.names), flush=True)


def _confirm(
    study: Any,
    spec: StudySpec,
    how: search.Measuring,
    lines: _TrialLines,
    budget: Budget | None,
) -> None:
    """The confirm step: the top configurations and the baseline measured again, in turns."""
    if not any_feasible(study):
        print(
            "not confirming: no configuration met the SLOs, and measuring vLLM's defaults "
            "again would not give one"
        )
        return
    if len(groups(study)) < 2:
        print("not confirming: no searched configuration served to hold against vLLM's defaults")
        return
    also = " and the spec's candidates" if spec.confirm_candidates else ""
    print(
        f"confirming: the top {spec.confirm_top_k} and the baseline{also}, measured "
        f"{spec.confirm_repeats} more times each, in turns"
    )
    confirm.confirm(
        study,
        how,
        spec.confirm_top_k,
        spec.confirm_repeats,
        on_trial=lines.finished,
        budget=budget,
        candidates=spec.confirm_candidates,
    )


def _plan(budget: Budget | None, spec: StudySpec, n_trials: int) -> None:
    """Say what the budget buys (nothing without one)."""
    if budget is not None:
        print(budget.plan(n_trials, spec.confirm_top_k, spec.confirm_repeats), flush=True)


def _run_trials(
    args: argparse.Namespace,
    study: Any,
    spec: StudySpec,
    name: str,
    vocab_size: int,
    replay: Replay,
    n_trials: int,
    machine: Mapping[str, str],
    launcher: Launcher,
    budget: Budget | None,
) -> None:
    lines = _TrialLines(spec)
    status = lines.status
    setup = trial_setup(spec, replay, vocab_size, launcher, status.show if status.live else None)
    setup = dataclasses.replace(setup, on_engine_start=lines.engine_started)
    first_new = len(study.trials)
    pinned = capture_pin(spec, environment.is_cpu_build())
    for key, value in pinned.items():
        print(f"pinned after trial 0, so that trials share vLLM's compiles: {key}={value}")
    log_handlers = logging.getLogger().handlers
    for handler in log_handlers:
        handler.addFilter(status.before_log)
    _plan(budget, spec, n_trials)

    def finished(trial: Any) -> None:
        lines.finished(trial)
        if budget is not None and len(budget.costs) == 1:
            _plan(budget, spec, n_trials)  # from the first trial's measured cost

    try:
        ran = search.run_study(
            study,
            spec,
            setup,
            args.runs / name,
            n_trials,
            on_trial=finished,
            on_start=lines.started,
            budget=budget,
            pinned=pinned,
            measured_on=machine,
        )
        if ran < n_trials:
            print(
                f"time budget: ran {ran} of {n_trials} trials, keeping the rest of it for the "
                "confirmation"
            )
        if spec.confirm_top_k and spec.confirm_repeats:
            how = search.Measuring(setup, args.runs / name, machine=machine, on_start=lines.started)
            _confirm(study, spec, how, lines, budget)
    finally:
        # Interrupted: the line stays, showing where the trial was.
        status.keep()
        for handler in log_handlers:
            handler.removeFilter(status.before_log)
    print(overhead_summary(study, first_new))
