"""What every trial of a run shares, built from the spec and the trace: the model made ready,
the window replayed (``Replay``, and with the trace it came from a ``Workload``), and the
``TrialSetup``. ``tuner run`` builds its trials with these, and so do the benchmarks that
measure as tuner does (``prepare``); the command line only says what they built.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from tuner.engine.dummy_model import is_complete, write_model
from tuner.engine.launchers import Launcher
from tuner.errors import InputError
from tuner.flags import random_weights
from tuner.load.http import Exchange, OpenAICompletions, ReplaySettings
from tuner.load.priming import PRIMING
from tuner.load.prompts import prompt_words
from tuner.load.template import TEXT
from tuner.study.measure.next_steps import Offered
from tuner.study.measure.scoring import Criteria
from tuner.study.measure.trial import OnProgress, TrialSetup
from tuner.study.plan.spec import AUTO, StudySpec
from tuner.study.setup.calibrate import TimeScale
from tuner.study.setup.objective import of_spec
from tuner.traces import concurrency
from tuner.traces.concurrency import ClosedLoopPlan, ConcurrencyTrace, LengthSource
from tuner.traces.model import Request, Trace
from tuner.traces.workload import ModelInfo, build_workload, model_info

logger = logging.getLogger(__name__)

# A warm-up sends at most the window's first this many seconds of requests, so a slow trace's
# warm-up cannot take a measurement's first minute (benchmarks/results/h100-gate-warm/).
WARMUP_MAX_S = 15.0


@dataclass
class Replay:
    """What every trial of a run replays: an open-loop window or a closed-loop schedule, what
    identifies it in the study's fingerprint, and how to say it."""

    requests: list[Request]
    closed_loop: ClosedLoopPlan | None
    block_tokens: int
    fingerprint: dict[str, Any]
    text: str
    # What an open-loop window asks of a server; None for a closed loop.
    offered: Offered | None = None
    # The window's rate in the trace's own time (its busiest ``window_s`` seconds, unscaled):
    # the peak a capacity is compared with. None for a closed loop.
    peak_req_per_s: float | None = None
    # Where prompts or outputs were cut to the model's context: what to say of it, else None.
    clipped: str | None = None
    # The hash ids of the window's prompts that the trace sent before the window: what the
    # prefix cache is primed with before a measured replay (``tuner.load.priming``).
    cached_ids: frozenset[int] = frozenset()


def replay_lines(replay: Replay) -> list[str]:
    """What is said of a replay: what was clipped to the model's context, if anything, and the
    window."""
    return [*([replay.clipped] if replay.clipped else []), f"window: {replay.text}"]


@dataclass(frozen=True)
class Workload:
    """The trace a run replays and the window of it that every trial replays (``replay``, at
    ``time_scale``), with the model it is fitted to: what the study's fingerprint records of
    them, and the written configuration's header names."""

    trace_path: Path
    trace_sha256: str
    # A request trace, replayed open-loop; None for a concurrency trace (a closed loop).
    trace: Trace | None
    replay: Replay
    window_s: float
    time_scale: float
    model: ModelInfo

    def fingerprint(self) -> dict[str, Any]:
        """The workload's part of the study's fingerprint."""
        return {
            "trace_sha256": self.trace_sha256,
            "window_s": self.window_s,
            "time_scale": self.time_scale,
            **self.replay.fingerprint,
        }


def write_dummy_model(spec: StudySpec, working: Path | None = None) -> bool:
    """Write the spec's model of shape ``dummy_model`` at ``model``, unless a complete one is
    there (``is_complete``); whether it wrote it. Nothing is written for a spec that names no
    ``dummy_model``.

    Its random weights are saved, so that the configuration measured is the one served, unless
    the spec measures on random weights (``load-format: dummy``: a large shape, no weights
    written). An ``InputError`` where ``model`` is outside the working folder (``working``, else
    the current one) or holds files tuner did not write (a model, or anything else).
    """
    if not spec.dummy_model:
        return False
    weights = not random_weights(spec.engine_args)
    if is_complete(spec.model, spec.dummy_model, weights):
        return False
    here = (working or Path.cwd()).resolve()
    target = Path(spec.model).resolve()
    said = f"dummy_model {spec.dummy_model} at {spec.model}"
    if target == here or not target.is_relative_to(here):
        raise InputError(f"{said}: a stand-in model is written only in a folder below {here}")
    try:
        write_model(spec.model, spec.dummy_model, weights)
    except FileExistsError as exc:
        raise InputError(
            f"{said}: {exc}; give dummy_model: null to measure it as it is, or another model"
        ) from None
    return True


def model_of(spec: StudySpec) -> ModelInfo:
    """The spec's model as vLLM resolves it (``model_info``), with the spec's context length,
    revision and remote-code setting."""
    max_len = spec.engine_args.get("max-model-len")
    return model_info(
        spec.model,
        int(max_len) if max_len else None,
        spec.engine_args.get("revision"),
        bool(spec.engine_args.get("trust-remote-code", False)),
    )


def open_loop_replay(
    trace: Trace,
    window_s: float,
    time_scale: float,
    max_model_len: int,
    longest_replay_s: float | None = None,
    warm_prefix_cache: bool = True,
) -> Replay:
    """A request trace's busiest window, time-scaled and fitted to the model's context; with
    ``warm_prefix_cache``, the shared blocks the trace sent before it to prime the prefix cache
    with."""
    workload = build_workload(trace, window_s, time_scale, max_model_len, longest_replay_s)
    clip = workload.clipping
    clipped = None
    if clip.inputs_clipped or clip.outputs_clipped:
        clipped = (
            f"clipped to the model's {max_model_len}-token context: "
            f"{clip.inputs_clipped} prompts, {clip.outputs_clipped} outputs"
        )
    cached = workload.cached_ids if warm_prefix_cache else frozenset()
    fingerprint: dict[str, Any] = {
        "window_start_s": workload.start_s,
        "requests": len(workload.trace),
    }
    if cached:
        fingerprint["primed_blocks"] = len(cached)
        fingerprint["priming"] = PRIMING
    return Replay(
        requests=workload.trace.requests(),
        closed_loop=None,
        block_tokens=trace.block_tokens,
        fingerprint=fingerprint,
        text=workload.describe(),
        offered=Offered(len(workload.trace), workload.replay_s),
        peak_req_per_s=workload.peak_req_per_s,
        clipped=clipped,
        cached_ids=cached,
    )


def closed_loop_replay(
    schedule: ConcurrencyTrace,
    lengths: LengthSource,
    lengths_from: str,
    window_s: float,
    time_scale: float,
    max_model_len: int,
) -> Replay:
    """A concurrency trace's busiest window, replayed closed-loop with lengths from ``lengths``
    (``lengths_from`` says where they come from, for the fingerprint)."""
    start_s = concurrency.busiest_window_start(schedule, window_s)
    window = schedule.window(start_s, window_s).scaled(time_scale)
    return Replay(
        requests=[],
        closed_loop=ClosedLoopPlan(window, lengths, max_model_len),
        block_tokens=0,
        fingerprint={"window_start_s": start_s, "closed_loop": True, "lengths": lengths_from},
        text=(
            f"closed loop from {start_s:.1f} s of the concurrency trace, {window.span_s:.1f} s, "
            f"up to {int(window.concurrency.max(initial=0))} in flight (time scale {time_scale:g})"
        ),
    )


def trial_setup(
    spec: StudySpec,
    criteria: Criteria,
    replay: Replay,
    vocab_size: int,
    launcher: Launcher,
    progress: OnProgress | None = None,
) -> TrialSetup:
    """What every trial of this run shares: the window, the client, the SLO ``criteria`` it is
    judged by, the launcher, and how a trial measures (the spec's objective's)."""
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
            exchange=exchange_of(spec),
            cached_ids=replay.cached_ids,
            history_seed=spec.seed,
        ),
        criteria=criteria,
        health_timeout_s=spec.health_timeout_s,
        warmup_requests=warmup_of(replay.requests, spec.warmup_requests),
        launcher=launcher,
        closed_loop=replay.closed_loop,
        progress=progress,
        measure=of_spec(spec).measure(spec, replay.requests, replay.offered),
        client_tolerance_s=spec.client_tolerance_s,
        server=None if spec.server is None else spec.server.command,
    )


def warmup_of(requests: list[Request], count: int) -> list[Request]:
    """The warm-up: the window's first ``count`` requests, those of its first ``WARMUP_MAX_S``
    seconds."""
    first = requests[:count]
    if not first:
        return first
    until = first[0].arrival_s + WARMUP_MAX_S
    return [r for r in first if r.arrival_s <= until]


def exchange_of(spec: StudySpec) -> Exchange:
    """What the spec's server is asked: its own request (text prompts made of the model's
    tokenizer's words), else vLLM's OpenAI completions."""
    template = None if spec.server is None else spec.server.request
    if template is None:
        return OpenAICompletions()
    if template.prompt == TEXT:
        return replace(template, words=prompt_words(spec.model))
    return template


@dataclass(frozen=True)
class Prepared:
    """A run's shared setup as ``prepare`` builds it."""

    model: ModelInfo
    replay: Replay
    setup: TrialSetup


def prepare(spec: StudySpec, trace: Trace, launcher: Launcher) -> Prepared:
    """What ``tuner run`` builds for a request trace at the spec's own window and time scale:
    the dummy model written if the spec has one, the model read, the busiest window, and the
    trials' setup."""
    write_dummy_model(spec)
    info = model_of(spec)
    replay = open_loop_replay(
        trace,
        spec.window_s,
        TimeScale(spec.time_scale).factor(),
        info.max_model_len,
        warm_prefix_cache=spec.warm_prefix_cache,
    )
    setup = trial_setup(spec, Criteria.of(spec), replay, info.vocab_size, launcher)
    return Prepared(info, replay, setup)
