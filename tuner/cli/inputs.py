"""What ``tuner run`` reads from its command line beside the spec: the trace (a request trace,
or a concurrency trace and the lengths its requests take), the spec's path, and the workload
every trial replays, said as it is built."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from tuner.cli.parser import STUDY_NAME, trace_options
from tuner.errors import InputError
from tuner.study.plan.spec import StudySpec
from tuner.study.result.run_config import RunConfig
from tuner.study.setup.objective import of_spec
from tuner.study.setup.prepare import (
    Workload,
    closed_loop_replay,
    open_loop_replay,
    replay_lines,
)
from tuner.traces.concurrency import ConcurrencyTrace, LengthSource, load_concurrency
from tuner.traces.formats import CONCURRENCY, decide_format, load_trace
from tuner.traces.model import Trace
from tuner.traces.source import is_stdin, read_source
from tuner.traces.workload import ModelInfo


def length_source(args: argparse.Namespace) -> tuple[LengthSource, str]:
    """Where a closed-loop replay draws its request lengths from, and what identifies it in the
    study's fingerprint (a trace's SHA-256, or the distributions)."""
    if args.lengths_trace:
        if is_stdin(args.lengths_trace) and is_stdin(args.trace):
            raise InputError("--trace and --lengths-trace cannot both be read from stdin (-)")
        source = read_source(args.lengths_trace)
        return LengthSource.from_trace(load_trace(source)), source.sha256
    if args.input_lengths and args.output_lengths:
        lengths = LengthSource.from_distributions(args.input_lengths, args.output_lengths)
        return lengths, f"{args.input_lengths} {args.output_lengths}"
    raise InputError(
        f"{args.trace} is a concurrency trace: give request lengths with --lengths-trace FILE "
        "or --input-lengths and --output-lengths (fixed:N, uniform:LO:HI, lognormal:MEDIAN:SIGMA)"
    )


def study_of(args: argparse.Namespace) -> str:
    """The study's name: ``--study``, else the trace file's stem where that is a name."""
    if args.study:
        return str(args.study)
    if is_stdin(args.trace):
        raise InputError("a trace read from stdin (-) has no name to give its study: add --study")
    if not STUDY_NAME.fullmatch(args.trace.stem):
        raise InputError(
            f"{args.trace}: its stem {args.trace.stem!r} is not a study name (letters, digits, "
            "'_', '.', '-'): add --study"
        )
    return str(args.trace.stem)


def spec_path(args: argparse.Namespace, name: str) -> Path:
    """The study's spec file: ``--spec``, else studies/NAME.yaml."""
    return args.spec or Path("studies") / f"{name}.yaml"


@dataclass(frozen=True)
class TraceRead:
    """The trace ``--trace`` names, read once: a request trace, or a concurrency trace's
    schedule and where its requests' lengths come from; the SHA-256 of what was read."""

    trace: Trace | None
    sha256: str
    schedule: ConcurrencyTrace | None = None
    lengths: LengthSource | None = None
    lengths_from: str = ""


def read_trace(args: argparse.Namespace) -> TraceRead:
    """The trace, read in one pass (a file, a pipe, a FIFO or ``-``), said in a line."""
    source = read_source(args.trace)
    if decide_format(source, args.format, args.columns) == CONCURRENCY:
        schedule = load_concurrency(source)
        lengths, lengths_from = length_source(args)
        print(f"concurrency trace {args.trace}: {len(schedule.time_s)} samples")
        return TraceRead(None, source.sha256, schedule, lengths, lengths_from)
    trace = load_trace(source, args.format, **trace_options(args))
    print(f"trace {args.trace}: {len(trace)} requests over {trace.span_s:.0f} s")
    return TraceRead(trace, source.sha256)


def workload_of(
    args: argparse.Namespace,
    config: RunConfig,
    spec: StudySpec,
    read: TraceRead,
    model: ModelInfo,
) -> Workload:
    """The window replayed, open-loop from a request trace or closed-loop from a concurrency
    one, the run's ``window_s`` long at its time scale (``auto``: the trace's speed, until the
    run calibrates it), and how (said, with the capacity search where the objective is
    capacity)."""
    window_s, time_scale = config.window_s, config.time_scale.factor()
    if read.trace is None:
        assert read.schedule is not None and read.lengths is not None
        replay = closed_loop_replay(
            read.schedule,
            read.lengths,
            read.lengths_from,
            window_s,
            time_scale,
            model.max_model_len,
        )
    else:
        replay = open_loop_replay(
            read.trace,
            window_s,
            time_scale,
            model.max_model_len,
            warm_prefix_cache=spec.warm_prefix_cache,
        )
    print("\n".join(replay_lines(replay)))
    said = of_spec(spec).measure(spec, replay.requests, replay.offered).describe()
    if said:
        print(said)
    return Workload(args.trace, read.sha256, read.trace, replay, window_s, time_scale, model)
