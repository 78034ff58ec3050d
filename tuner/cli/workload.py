"""What every trial of a run replays, built from the trace and the spec, and its fingerprint."""

from __future__ import annotations

import argparse
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuner.engine.launchers import Launcher
from tuner.errors import InputError
from tuner.load.http import ReplaySettings
from tuner.study.measure.objective import of_spec
from tuner.study.measure.outcome import Offered
from tuner.study.measure.trial import Objective, OnProgress, TrialSetup
from tuner.study.plan.spec import AUTO, StudySpec
from tuner.study.trials.fingerprint import WORKLOAD_ATTR, differences
from tuner.traces import concurrency
from tuner.traces.concurrency import ClosedLoop, ConcurrencyTrace, LengthSource
from tuner.traces.formats import load_trace
from tuner.traces.model import Request, Trace
from tuner.traces.workload import Workload, build_workload


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


def check_workload(study: Any, fingerprint: Mapping[str, Any]) -> None:
    """Refuse a study whose trials were measured or judged otherwise than ``fingerprint`` says.

    Compared on the keys both hold: the machine's (vLLM version, device) only when this run
    adds trials, and a study recorded before tuner checked the spec has only the trace and the
    window. Keys the study lacks are recorded now, and checked from then on; if the study has
    trials already, a line says which keys its earlier trials were not checked against.
    """
    recorded = study.user_attrs.get(WORKLOAD_ATTR)
    if recorded is None:
        study.set_user_attr(WORKLOAD_ATTR, dict(fingerprint))
        return
    differ = differences(recorded, fingerprint)
    if differ:
        raise InputError(
            f"study {study.study_name!r} was measured another way ({'; '.join(differ)}): its "
            "trials would not compare with new ones; use --study NEWNAME (or delete the DB) to "
            "start a new study"
        )
    missing = [key for key in fingerprint if key not in recorded]
    if not missing:
        return
    study.set_user_attr(WORKLOAD_ATTR, {**recorded, **fingerprint})
    if study.trials:
        print(
            f"study {study.study_name!r} predates tuner checking {', '.join(sorted(missing))}: "
            f"its {len(study.trials)} trials were not checked against them; recorded now"
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
    # The window's rate in the trace's own time (its busiest ``window_s`` seconds, unscaled):
    # the peak a capacity is compared with. None for a closed loop.
    peak_req_per_s: float | None = None


def spec_path(args: argparse.Namespace, name: str) -> Path:
    """The study's spec file: ``--spec``, else studies/NAME.yaml."""
    return args.spec or Path("studies") / f"{name}.yaml"


def closed_loop_replay(
    args: argparse.Namespace,
    schedule: ConcurrencyTrace,
    lengths: LengthSource,
    window_s: float,
    time_scale: float,
    max_model_len: int,
) -> Replay:
    """A concurrency trace's busiest window, replayed closed-loop with lengths from ``lengths``."""
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


def open_loop_replay(
    trace: Trace,
    window_s: float,
    time_scale: float,
    max_model_len: int,
    longest_replay_s: float | None = None,
) -> Replay:
    """A request trace's busiest window, time-scaled and fitted to the model's context."""
    workload: Workload = build_workload(
        trace, window_s, time_scale, max_model_len, longest_replay_s
    )
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
        peak_req_per_s=workload.peak_req_per_s,
    )


def trial_setup(
    spec: StudySpec,
    replay: Replay,
    vocab_size: int,
    launcher: Launcher,
    progress: OnProgress | None = None,
) -> TrialSetup:
    """What every trial of this run shares: the window, the client, the SLOs, the launcher."""
    return TrialSetup(
        model=spec.model,
        requests=replay.requests,
        replay=ReplaySettings(
            model=str(spec.engine_args.get("served-model-name", spec.model)),
            vocab_size=vocab_size,
            block_tokens=replay.block_tokens,
            seed=spec.seed,
            client_procs=0 if spec.client_procs == AUTO else int(spec.client_procs),
            request_timeout_s=spec.stall_timeout_s,
        ),
        objective=Objective(spec.slos, spec.weights, spec.max_error_rate),
        health_timeout_s=spec.health_timeout_s,
        warmup_requests=replay.requests[: spec.warmup_requests],
        launcher=launcher,
        closed_loop=replay.closed_loop,
        progress=progress,
        measure=of_spec(spec).measure(spec, replay.requests, replay.offered),
        client_tolerance_s=spec.client_tolerance_s,
    )
