"""What ``tuner run`` reads from its command line beside the spec: the trace (a request trace,
or a concurrency trace and the lengths its requests take), the spec's path, and the workload
every trial replays, said as it is built."""

from __future__ import annotations

import argparse
import hashlib
from dataclasses import dataclass
from pathlib import Path

from tuner.cli.parser import trace_options
from tuner.errors import InputError
from tuner.study.measure.objective import of_spec
from tuner.study.measure.prepare import (
    Workload,
    closed_loop_replay,
    open_loop_replay,
    replay_lines,
)
from tuner.study.plan.spec import StudySpec
from tuner.traces.concurrency import ConcurrencyTrace, LengthSource, load_concurrency
from tuner.traces.formats import CONCURRENCY, decide_format, load_trace
from tuner.traces.model import Trace
from tuner.traces.workload import ModelInfo


def length_source(args: argparse.Namespace) -> LengthSource:
    """Where a closed-loop replay draws its request lengths from."""
    if args.lengths_trace:
        return LengthSource.from_trace(load_trace(args.lengths_trace))
    if args.input_lengths and args.output_lengths:
        return LengthSource.from_distributions(args.input_lengths, args.output_lengths)
    raise InputError(
        f"{args.trace} is a concurrency trace: give request lengths with --lengths-trace FILE "
        "or --input-lengths and --output-lengths (fixed:N, uniform:LO:HI, lognormal:MEDIAN:SIGMA)"
    )


def sha256_of(path: Path) -> str:
    """The file's SHA-256, hex: which trace a study and a written configuration came from."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def spec_path(args: argparse.Namespace, name: str) -> Path:
    """The study's spec file: ``--spec``, else studies/NAME.yaml."""
    return args.spec or Path("studies") / f"{name}.yaml"


@dataclass(frozen=True)
class TraceRead:
    """The trace ``--trace`` names: a request trace, or a concurrency trace's schedule and where
    its requests' lengths come from."""

    trace: Trace | None
    schedule: ConcurrencyTrace | None = None
    lengths: LengthSource | None = None


def read_trace(args: argparse.Namespace) -> TraceRead:
    """The trace, said in a line."""
    if decide_format(args.trace, args.format, args.columns) == CONCURRENCY:
        schedule, lengths = load_concurrency(args.trace), length_source(args)
        print(f"concurrency trace {args.trace}: {len(schedule.time_s)} samples")
        return TraceRead(None, schedule, lengths)
    trace = load_trace(args.trace, args.format, **trace_options(args))
    print(f"trace {args.trace}: {len(trace)} requests over {trace.span_s:.0f} s")
    return TraceRead(trace)


def workload_of(
    args: argparse.Namespace,
    spec: StudySpec,
    read: TraceRead,
    time_scale: float,
    model: ModelInfo,
) -> Workload:
    """The window replayed, open-loop from a request trace or closed-loop from a concurrency
    one, ``--window-s`` seconds long (else the spec's), and how (said, with the capacity search
    where the objective is capacity)."""
    # The parser took only positive numbers: an option given is never dropped for the spec's.
    window_s = spec.window_s if args.window_s is None else args.window_s
    if read.trace is None:
        assert read.schedule is not None and read.lengths is not None
        lengths_from = (
            sha256_of(args.lengths_trace)
            if args.lengths_trace
            else f"{args.input_lengths} {args.output_lengths}"
        )
        replay = closed_loop_replay(
            read.schedule, read.lengths, lengths_from, window_s, time_scale, model.max_model_len
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
    sha = sha256_of(args.trace)
    return Workload(args.trace, sha, read.trace, replay, window_s, time_scale, model)
