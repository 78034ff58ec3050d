"""The ``tuner`` command line's arguments: one parser, the trace options shared by commands."""

from __future__ import annotations

import argparse
import math
import re
from pathlib import Path
from typing import Any, NoReturn

import tuner
from tuner import build
from tuner.engine.launchers import AUTO as AUTO_LAUNCHER
from tuner.engine.launchers import LAUNCHERS
from tuner.study.plan.layouts import Layout
from tuner.study.plan.spec import SCORED_METRICS
from tuner.study.plan.spec_values import LEAST_SCALE, MOST_SCALE
from tuner.study.setup.objective import OBJECTIVES
from tuner.traces.formats import FORMATS, parse_column_mapping
from tuner.traces.parsers import TIME_UNITS_PER_S
from tuner.traces.prometheus_http import parse_header


class Parser(argparse.ArgumentParser):
    """``argparse``'s parser, its usage errors said in one line (``--help`` shows the usage);
    its sub-commands' parsers are of this class too."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())}\n")


class _Version(argparse.Action):
    """``--version``: the build (``tuner.build.describe``), asked only when shown, so that other
    commands start without asking git."""

    def __init__(self, option_strings: list[str], dest: str, help: str | None = None) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=help)

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> NoReturn:
        print(f"tuner {build.describe()}")  # on stdout, as argparse's own version action
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    """The ``tuner`` parser: init, run, trace, report and compile-key."""
    parser = Parser(prog="tuner", description=tuner.__doc__)
    parser.add_argument("--version", action=_Version, help="show tuner's build and exit")
    parser.add_argument("-v", "--verbose", action="store_true", help="log tuner's steps")
    commands = parser.add_subparsers(dest="command", required=True)

    init = commands.add_parser(
        "init", help="write the study spec for this trace, model and machine, and stop"
    )
    init.add_argument("--trace", required=True, type=Path, help="trace file (-: stdin)")
    add_trace_options(init)
    add_study_options(init)
    init.add_argument(
        "--current",
        type=Path,
        metavar="FILE",
        help="the configuration you serve today, a YAML as vllm serve --config reads it: the "
        "study's baseline, measured and confirmed against, with vLLM's defaults beside it",
    )
    add_run_command(commands)
    add_trace_commands(commands)
    add_report_command(commands)
    keys = commands.add_parser(
        "compile-key",
        help="which searched engine arguments change vLLM's compile key (the installed vLLM's)",
    )
    keys.add_argument("--spec", type=Path, required=True, help="study spec")
    return parser


def add_run_command(commands: Any) -> None:
    """``tuner run``: the trace, the study, and how this run measures and writes."""
    run = commands.add_parser("run", help="tune vLLM against a replayed trace")
    run.add_argument("--trace", required=True, type=Path, help="trace file (-: stdin)")
    add_trace_options(run)
    add_study_options(run)
    run.add_argument(
        "--n-trials", type=trial_count, help="trials to add in this run (default: spec)"
    )
    run.add_argument(
        "--confirm-only",
        action="store_true",
        help="add no trial: only finish re-measuring the winner, the baseline (and the spec's "
        "candidates, with confirm_candidates) where an earlier run's confirmation was cut short",
    )
    add_worker_options(run)
    run.add_argument(
        "--time-budget-s",
        type=positive_number,
        help="seconds the whole run may take, calibration included: no trial starts that "
        "would end after them (overrides the spec's time_budget_s)",
    )
    run.add_argument("--window-s", type=positive_number, help="replay window in trace seconds")
    run.add_argument(
        "--time-scale",
        type=time_scale,
        help=f"multiply arrival times (< 1 is faster; {LEAST_SCALE:g} to {MOST_SCALE:g})",
    )
    run.add_argument("--configs", type=Path, default=Path("configs"), help="output folder")
    run.add_argument("--runs", type=Path, default=Path("runs"), help="trial logs folder")
    run.add_argument(
        "--lengths-trace", type=Path, help="request trace whose lengths a concurrency trace draws"
    )
    run.add_argument(
        "--input-lengths", help="prompt lengths for a concurrency trace: uniform:10:200"
    )
    run.add_argument("--output-lengths", help="output lengths for a concurrency trace")
    add_server_options(run)
    run.add_argument("--report", action="store_true", help="write the HTML report at the end")
    run.add_argument(
        "--json",
        metavar="FILE",
        help="also write the outcome as JSON to FILE, for a program to read (-: standard "
        "output, the run's other lines then on standard error; docs/results.md); with "
        "--no-confirm, none is written: the --confirm-only run writes it",
    )
    run.add_argument(
        "--client-procs",
        type=client_procs,
        metavar="auto|N",
        help="processes tuner's replay client is spread over; auto: as many as the window's "
        "busiest second needs (default: the spec's client_procs, else auto)",
    )


def add_server_options(run: argparse.ArgumentParser) -> None:
    """Which server ``tuner run`` measures, and how it is started: vLLM's OpenAI server by a
    launcher, your own app by its command, or none, for a server already running at a URL."""
    run.add_argument(
        "--launcher",
        choices=(AUTO_LAUNCHER, *LAUNCHERS),
        default=AUTO_LAUNCHER,
        help="process: a fresh interpreter per trial; zygote: import vLLM's server once and "
        "fork one per trial (faster starts); auto (default): zygote, except on vLLM's CPU "
        "build (docs/how-it-works.md)",
    )
    run.add_argument(
        "--server-command",
        help="start your own server around vLLM's AsyncLLM instead of vLLM's OpenAI server: a "
        "command with {port} and {config} (a YAML of AsyncEngineArgs fields written per trial); "
        "overrides the spec's server.command",
    )
    run.add_argument(
        "--server-url",
        metavar="URL",
        help="measure the server already running at URL once, as it is, with the spec's "
        "objective: tuner did not start it, so nothing is searched and no configuration is "
        "written (docs/spec.md)",
    )


def add_worker_options(run: argparse.ArgumentParser) -> None:
    """Where the study is kept, and how the workers of one study share it (docs/workers.md)."""
    run.add_argument(
        "--storage",
        help="Optuna storage URL, or journal:FILE (default: sqlite:///studies/NAME.db; with "
        "--gpus, journal:studies/NAME.log)",
    )
    run.add_argument(
        "--gpus",
        metavar="all|I,J,...",
        help="one worker per GPU (all, or nvidia-smi indices), on one study, then the "
        "confirmation on the first (default: one worker on the GPUs CUDA_VISIBLE_DEVICES gives)",
    )
    run.add_argument(
        "--layout",
        type=layout,
        metavar="TxD",
        help="every trial's server at tensor-parallel-size T and data-parallel-size D, on the "
        "T*D GPUs CUDA_VISIBLE_DEVICES gives (default: the layout the study kept, else 1x1; "
        "--gpus picks one itself: docs/workers.md)",
    )
    run.add_argument(
        "--no-confirm",
        action="store_true",
        help="add trials, then exit 0 writing nothing: the confirmation and the configuration "
        "are left to a later --confirm-only run (a worker of several on one study)",
    )


def add_study_options(parser: argparse.ArgumentParser) -> None:
    """What a new study spec is written from, and what overrides an existing one's."""
    parser.add_argument(
        "--study", type=study_name, help="study name (default: the trace file's stem)"
    )
    parser.add_argument("--spec", type=Path, help="study spec (default: studies/NAME.yaml)")
    parser.add_argument(
        "--model",
        help="a local model folder or a Hugging Face model id (from the Hugging Face cache, "
        "as vLLM resolves it), written into a new spec (default: a small demo model)",
    )
    parser.add_argument(
        "--dummy-weights",
        action="store_true",
        help="measure on random weights of the model's shape (load-format dummy); the config "
        "written leaves that out, to serve the model's weights",
    )
    parser.add_argument(
        "--slo",
        action="append",
        type=slo,
        metavar="METRIC=SECONDS",
        help="an SLO, e.g. ttft_p95_s=0.3 (repeatable; replaces the spec's SLOs, each weighted "
        f"1 in the score; metrics: {', '.join(SCORED_METRICS)})",
    )
    parser.add_argument(
        "--objective",
        choices=list(OBJECTIVES),
        help="what the study optimises, as the spec's objective_mode (docs/spec.md) names it "
        "(default: the spec's objective_mode, else latency)",
    )


def slo(text: str) -> tuple[str, float]:
    """``METRIC=SECONDS``: a scored metric and a positive number."""
    metric, sep, value = text.partition("=")
    metric = metric.strip()
    if not sep or metric not in SCORED_METRICS:
        raise argparse.ArgumentTypeError(
            f"must be METRIC=SECONDS with METRIC one of {', '.join(SCORED_METRICS)}, got {text!r}"
        )
    return metric, positive_number(value)


STUDY_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
"""A study name: what it names (studies/NAME.yaml, configs/NAME.yaml, runs/NAME/) stays in
its folder."""


def study_name(text: str) -> str:
    """``--study``: a name of letters, digits, ``_``, ``.`` and ``-``, not a path."""
    if not STUDY_NAME.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"must be a name of letters, digits, '_', '.' and '-' (not starting with '.' or "
            f"'-', at most 128), not a path; got {text!r}"
        )
    return text


def time_scale(text: str) -> float:
    """``--time-scale``: a positive factor within what a spec's ``time_scale`` takes."""
    value = positive_number(text)
    if not LEAST_SCALE <= value <= MOST_SCALE:
        raise argparse.ArgumentTypeError(
            f"must be from {LEAST_SCALE:g} to {MOST_SCALE:g}, got {text!r}"
        )
    return value


def png_path(text: str) -> Path:
    """``--png``: a file name ending in ``.png`` (the plot is written under that name)."""
    if not text.lower().endswith(".png"):
        raise argparse.ArgumentTypeError(f"must name a .png file, got {text!r}")
    return Path(text)


def layout(text: str) -> Layout:
    """``--layout``: ``TxD``, tensor-parallel-size x data-parallel-size."""
    try:
        return Layout.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def client_procs(text: str) -> int | str:
    """``--client-procs``: "auto" or a positive whole number."""
    if text == "auto":
        return text
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be auto or a whole number >= 1, not {text!r}")
    return value


def add_trace_options(parser: argparse.ArgumentParser) -> None:
    """How a trace file is read: its format, columns, time unit and which model's rows."""
    parser.add_argument("--format", choices=sorted(FORMATS), help="trace format (default: detect)")
    parser.add_argument(
        "--columns",
        type=column_mapping,
        help="columns of any CSV/JSONL: timestamp=ts,input_tokens=in,output_tokens=out",
    )
    parser.add_argument(
        "--time-unit", choices=sorted(TIME_UNITS_PER_S), default="s", help="of --columns timestamps"
    )
    parser.add_argument("--trace-model", help="keep only this model's rows (BurstGPT)")


def positive_number(text: str) -> float:
    """A finite number above 0, such as a number of seconds or a scale."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}")
    return value


def trial_count(text: str) -> int:
    """A whole number of trials, 0 or more (0: only report on the study)."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 0, got {text!r}")
    return value


def seed(text: str) -> int:
    """A random seed: a whole number, 0 or more (numpy's generators take no negative seed)."""
    if not (text.isascii() and text.isdigit()):
        raise argparse.ArgumentTypeError(f"must be a whole number >= 0, got {text!r}")
    return int(text)


def http_header(text: str) -> tuple[str, str]:
    """``--header NAME: VALUE`` for requests to Prometheus."""
    try:
        return parse_header(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def column_mapping(text: str) -> dict[str, str]:
    """``--columns``: which of a CSV's columns hold arrival times and lengths."""
    try:
        return parse_column_mapping(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def trace_options(args: argparse.Namespace) -> dict[str, Any]:
    """The keyword arguments of ``load_trace`` that the trace options give."""
    return {"columns": args.columns, "time_unit": args.time_unit, "model": args.trace_model}


def add_trace_commands(commands: Any) -> None:
    """``tuner trace inspect`` and ``tuner trace from-prometheus``."""
    trace = commands.add_parser("trace", help="look at a trace, or rebuild one from Prometheus")
    sub = trace.add_subparsers(dest="trace_command", required=True)
    inspect = sub.add_parser("inspect", help="the shape of a trace's traffic")
    inspect.add_argument("file", type=Path, help="request trace or concurrency trace (-: stdin)")
    add_trace_options(inspect)
    inspect.add_argument("--json", action="store_true", help="print the figures as JSON")
    inspect.add_argument("--png", type=png_path, help="plot file, .png (default: STEM-inspect.png)")
    inspect.add_argument("--no-png", action="store_true", help="write no plot")
    inspect.add_argument(
        "--window-s", type=positive_number, default=60.0, help="tuner run's window"
    )
    inspect.add_argument(
        "--tpot-ms", type=positive_number, default=30.0, help="service model: decode"
    )
    inspect.add_argument(
        "--prefill-tokens-per-s",
        type=positive_number,
        default=8000.0,
        help="service model: prefill",
    )
    rebuild = sub.add_parser("from-prometheus", help="rebuild a trace from vLLM's metrics")
    rebuild.add_argument("--url", required=True, help="Prometheus base URL")
    rebuild.add_argument("--start", required=True, help="epoch seconds or ISO 8601 (UTC)")
    rebuild.add_argument("--end", required=True, help="epoch seconds or ISO 8601 (UTC)")
    rebuild.add_argument("--selector", default="", help='label matchers, e.g. job="vllm"')
    rebuild.add_argument(
        "--header",
        action="append",
        default=[],
        type=http_header,
        metavar="'NAME: VALUE'",
        help="an HTTP header sent with each query (repeatable), e.g. 'X-Scope-OrgID: prod'",
    )
    rebuild.add_argument(
        "--bearer-token-file", type=Path, metavar="FILE", help="send the token in FILE as Bearer"
    )
    rebuild.add_argument("--basic-auth-user", metavar="USER", help="HTTP basic auth user")
    rebuild.add_argument(
        "--basic-auth-password-file",
        type=Path,
        metavar="FILE",
        help="the basic auth password, read from FILE (never given on the command line)",
    )
    rebuild.add_argument(
        "--ca-file", type=Path, metavar="FILE", help="CA certificates to verify HTTPS against"
    )
    rebuild.add_argument(
        "--insecure",
        action="store_true",
        help="do not verify an HTTPS Prometheus's TLS certificate (verified by default)",
    )
    rebuild.add_argument("--step-s", type=positive_number, default=15.0, help="query resolution")
    rebuild.add_argument("--seed", type=seed, default=0, help="for arrivals and lengths")
    rebuild.add_argument("--out", type=Path, default=Path("prometheus-trace.csv"))
    rebuild.add_argument("--concurrency-out", type=Path, help="default: OUT.concurrency.csv")


def add_report_command(commands: Any) -> None:
    """``tuner report``: a study's HTML page."""
    report = commands.add_parser("report", help="an HTML page of what a study found, with plots")
    report.add_argument("study", type=study_name, help="study name")
    report.add_argument("--storage", help="Optuna storage URL (default: sqlite:///studies/NAME.db)")
    report.add_argument("--out", type=Path, help="output folder (default: reports/NAME)")
    report.add_argument(
        "--configs", type=Path, default=Path("configs"), help="where tuner run wrote NAME.yaml"
    )
    report.add_argument(
        "--json",
        metavar="FILE",
        help="write the outcome as JSON to FILE instead of the page, as tuner run --json does "
        "(-: standard output; docs/results.md)",
    )
