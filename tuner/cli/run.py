"""``tuner run``: measure configurations against the replayed trace, write the best.

The command line reads the trace and the spec, resolves the run's configuration once from both
(``run_config``: a ``RunConfig``), opens the study and builds one
``tuner.study.result.run.Run`` of that configuration, drives its steps (calibrate, add trials,
confirm, result), prints what they tell and maps the outcome to the exit status.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path
from typing import TextIO

import optuna

from tuner.cli.exits import EXIT_MEETS_SLOS
from tuner.cli.gpus import run_on_gpus
from tuner.cli.inputs import read_trace, study_of, workload_of
from tuner.cli.output import check_file_target
from tuner.cli.progress import RunLines
from tuner.cli.report import after_run
from tuner.cli.result import overhead_summary, said_result
from tuner.cli.result_json import STDOUT, lines_to_stderr, result_document, write_document
from tuner.cli.spec import checked_spec, load_study_spec
from tuner.engine import environment
from tuner.engine.launchers import AUTO as AUTO_LAUNCHER
from tuner.engine.launchers import LAUNCHERS, Launcher, auto_launcher
from tuner.engine.own_server import CommandLauncher, ServerCommand
from tuner.errors import InputError
from tuner.study.plan.own_server import OwnServer
from tuner.study.plan.spec import StudySpec
from tuner.study.result.run import Run
from tuner.study.result.run_config import RunConfig, default_storage, resolve
from tuner.study.setup.objective import of_spec
from tuner.study.setup.prepare import model_of
from tuner.study.store.storage import dashboard_target
from tuner.study.trials import search
from tuner.study.trials.workers import fail_orphans
from tuner.urls import shown_url


def launcher_for(choice: str, log: Path) -> Launcher:
    """The launcher ``--launcher`` names (``LAUNCHERS``; auto: ``auto_launcher``), said on
    stdout."""
    kind = auto_launcher(environment.is_cpu_build()) if choice == AUTO_LAUNCHER else choice
    print(f"launcher: {kind}" + (" (auto)" if choice == AUTO_LAUNCHER else ""))
    return LAUNCHERS[kind](log)


def server_command_of(args: argparse.Namespace) -> ServerCommand | None:
    """``--server-command``, checked; an ``InputError`` where it lacks ``{port}`` or
    ``{config}``."""
    if args.server_command is None:
        return None
    try:
        return ServerCommand(args.server_command)
    except ValueError as exc:
        raise InputError(f"--server-command: {exc}") from None


def with_server_command(spec: StudySpec, command: ServerCommand | None) -> StudySpec:
    """The spec with ``command`` as its server's (the spec's health path and request kept)."""
    if command is None:
        return spec
    if spec.server is None:
        return dataclasses.replace(spec, server=OwnServer(command))
    health = spec.server.command.health_path
    started = dataclasses.replace(command, health_path=health)
    return dataclasses.replace(spec, server=OwnServer(started, spec.server.request))


def server_launcher(choice: str, log: Path, spec: StudySpec) -> Launcher:
    """The spec's own server's command launcher, said on stdout, else ``launcher_for``'s."""
    if spec.server is None:
        return launcher_for(choice, log)
    request = spec.server.request
    asked = "OpenAI completions" if request is None else f"POST {request.path}"
    print(f"server: {spec.server.command.command} ({asked})")
    return CommandLauncher()


def run_config(
    args: argparse.Namespace, name: str, spec: StudySpec, began: float | None = None
) -> RunConfig:
    """The run's configuration: the command line's values over the spec's (``resolve``), the
    study ``name``'s engine logs under ``--runs`` and its configuration written in
    ``--configs``. An ``InputError`` where ``--layout`` asks for more GPUs than nvidia-smi
    lists under ``CUDA_VISIBLE_DEVICES``."""
    layout = getattr(args, "layout", None)
    visible = environment.visible_gpus() if layout is not None else []
    if layout is not None and visible and len(visible) < layout.gpus:
        raise InputError(
            f"--layout {layout.name}: a server of {layout} needs {layout.gpus} GPUs; "
            f"CUDA_VISIBLE_DEVICES gives {len(visible)}"
        )
    return resolve(
        spec,
        name,
        args.runs / name,
        args.configs / f"{name}.yaml",
        storage=args.storage,
        n_trials=args.n_trials,
        confirm_only=args.confirm_only,
        time_budget_s=args.time_budget_s,
        window_s=args.window_s,
        time_scale=args.time_scale,
        launcher=args.launcher,
        began=began,
        layout=layout,
    )


def _say_budget(budget_s: float, flag: bool, spec: StudySpec) -> None:
    """The time budget's line, before the first trial (``flag``: given on the command line)."""
    where = "--time-budget-s" if flag else "the spec's time_budget_s"
    first = "the spec's baseline" if spec.names_baseline else "vLLM's defaults"
    print(
        f"time budget: {budget_s:g} s for the whole run ({where}); the search stops where one "
        "more trial would leave too little for the confirmation; the first trial always runs "
        f"(in a new study, {first})"
    )


def cmd_run(args: argparse.Namespace) -> int:
    """``tuner run``: read the trace and the spec (writing one if there is none), calibrate where
    asked, add the trials, confirm the winner and write its configuration; the exit status says
    whether it meets the SLOs. With ``--json -``, what it prints for people goes to stderr and
    stdout carries the outcome's JSON alone."""
    check_json(args)
    if args.gpus is not None:
        return run_on_gpus(args)
    with lines_to_stderr(args.json) as stdout:
        return _run(args, stdout)


def check_json(args: argparse.Namespace) -> None:
    """An ``InputError`` where ``--json`` cannot be written, before any trial: its folder is
    missing, or standard output is asked of a run that writes no outcome there (a worker of
    ``--no-confirm``, or ``--gpus``, whose workers share standard output)."""
    if args.json is None:
        return
    if args.json != STDOUT:
        check_file_target(Path(args.json), "--json")
        return
    if args.gpus is not None or args.no_confirm:
        given = "--gpus" if args.gpus is not None else "--no-confirm"
        raise InputError(
            f"--json -: {given} runs print on standard output; give --json a file "
            "(with --gpus, the confirmation's run writes it)"
        )


def _run(args: argparse.Namespace, stdout: TextIO) -> int:
    """``cmd_run``'s work, the outcome's JSON (``--json``) written to ``stdout`` where it is
    ``-``."""
    began = time.monotonic()
    name = study_of(args)
    # Bad input stops here, before anything is written.
    read = read_trace(args)
    command = server_command_of(args)
    spec = load_study_spec(args, name, read.trace)
    config = run_config(args, name, spec, began)
    spec = with_server_command(spec, command)
    spec = checked_spec(args, name, spec, read.trace is not None, config.measures)
    workload = workload_of(args, config, spec, read, model_of(spec))
    study = _open_study(config, spec)
    storage, n_trials = config.storage, config.n_trials
    log = config.run_dir / "launcher.log"
    launcher = server_launcher(config.launcher, log, spec) if config.measures else None
    lines = RunLines(spec)
    try:
        run = Run(study, spec, workload, config, lines, launcher=launcher)
        if run.budget_s is not None:
            _say_budget(run.budget_s, config.budget_given, spec)
        run.calibrate()
        print(
            f"study {name!r} in {shown_url(storage)}: {len(study.trials)} trials so far, "
            f"adding {n_trials}"
        )
        if launcher is not None:
            first_new = len(study.trials)
            with lines.showing():
                run.add_trials()
                if not args.no_confirm:
                    run.confirm()
            print(overhead_summary(study, first_new))
    finally:
        if launcher is not None:
            launcher.close()
    return _ended(args, config, study, run, stdout)


def _ended(
    args: argparse.Namespace, config: RunConfig, study: optuna.Study, run: Run, stdout: TextIO
) -> int:
    """The run's last lines and exit status: the result written (and its JSON, with
    ``--json``), or, for ``--no-confirm``, nothing written (exit 0: its trials were added)."""
    name, storage = config.study, config.storage
    print(f"\ndashboard: optuna-dashboard {dashboard_target(storage)}")
    if args.no_confirm:
        print("no configuration written: the confirmation is left to a later run, --confirm-only")
        if args.json is not None:
            print(f"no JSON written to {args.json}: the --confirm-only run writes it")
        return EXIT_MEETS_SLOS
    code = said_result(args, name, study, run.result())
    if args.json is not None:
        write_document(result_document(study, storage, config.config_path), args.json, stdout)
        if args.json != STDOUT:
            print(f"json: {args.json}")
    return after_run(args, name, storage, code)


def _open_study(config: RunConfig, spec: StudySpec) -> optuna.Study:
    """The study; trials whose tuner is gone are marked failed (said)."""
    name, storage = config.study, config.storage
    if storage == default_storage(name):
        # The default storage's folder, made here as the default spec's is: a spec given
        # elsewhere leaves it missing. A URL given is used as given; a folder missing there is
        # more likely a slip, and the error names it.
        Path("studies").mkdir(exist_ok=True)
    study = search.open_study(
        name, storage, config.seed, search.pruner_for(spec), objective=of_spec(spec)
    )
    for orphan in fail_orphans(study):
        print(f"trial {orphan.number}: its tuner is gone (killed or crashed); marked failed")
    return study
