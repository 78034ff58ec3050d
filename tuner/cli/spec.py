"""The study spec as ``tuner run`` and ``tuner init`` take it: written for the trace, model and
machine where there is none, read with the command line's settings over it, and checked against
the installed vLLM and this machine."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

from tuner.cli.inputs import spec_path, study_of
from tuner.cli.output import check_writable
from tuner.cli.parser import trace_options
from tuner.engine import arguments, environment, vllm_defaults
from tuner.errors import InputError
from tuner.flags import LOAD_FORMAT, RANDOM_WEIGHTS, flag_name, random_weights
from tuner.study.plan.current import Current, read_current
from tuner.study.plan.own_server import SERVER_ONLY_ARGUMENTS
from tuner.study.plan.space import (
    default_spec_text,
    engine_defaults,
    runnable_baseline,
    table_batch_defaults,
)
from tuner.study.plan.spec import DEFAULT_SPEC, StudySpec, load_spec, parse_spec
from tuner.study.plan.spec_file import read_spec_document
from tuner.study.result.written import write_whole
from tuner.study.setup.objective import OBJECTIVES, of_spec
from tuner.study.setup.prepare import write_dummy_model
from tuner.traces.formats import CONCURRENCY, decide_format, load_trace
from tuner.traces.model import Trace
from tuner.traces.source import read_source
from tuner.traces.workload import model_info

# The objective a spec names where it names none.
DEFAULT_MODE = DEFAULT_SPEC["objective_mode"]


def spec_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """What the command line sets in the spec: its SLOs (each weighted 1) and objective mode."""
    out: dict[str, Any] = {}
    if args.slo:
        out["slos"] = dict(args.slo)
        out["weights"] = dict.fromkeys(out["slos"], 1.0)
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
    overrides = spec_overrides(args)
    model = args.model
    current_file = getattr(args, "current", None)
    if current_file is not None:
        current = read_current(current_file)
        if model and current.model and model != current.model:
            raise InputError(
                f"--model {model} differs from the model {current_file} serves, {current.model}"
            )
        model = model or current.model
        overrides |= current.spec_keys()
        _say_current(current_file, current)
    if model:
        model_info(model, None)
    path.parent.mkdir(parents=True, exist_ok=True)
    prompts = None if trace is None else [int(n) for n in trace.input_tokens]
    gpu = not environment.is_cpu_build()
    device = next(iter(environment.visible_gpus()), None) if gpu else None
    memory = None if gpu else environment.host_memory()
    batch = _installed_defaults(gpu, device)
    text = default_spec_text(
        model,
        gpu=gpu,
        prompt_tokens=prompts,
        device=device,
        cpu_memory=memory,
        dummy_weights=args.dummy_weights,
        overrides=overrides,
        batch=batch,
        searches_rates=OBJECTIVES[overrides.get("objective_mode", DEFAULT_MODE)].searches_rates,
    )
    write_whole(path, text)


def _installed_defaults(
    gpu: bool, device: environment.Gpu | None
) -> vllm_defaults.BatchDefaults | None:
    """vLLM's max-num-seqs and max-num-batched-tokens as the vLLM installed gives them, said
    where they differ from tuner's table or could not be read (then the table's are used)."""
    seqs, tokens = table_batch_defaults(gpu, device)
    asked = vllm_defaults.installed(device)
    batch = asked.defaults
    if batch is None:
        print(
            f"vLLM's defaults: not read from the vLLM installed ({asked.why_not}); the spec "
            f"starts from tuner's table of them: max-num-seqs {seqs}, max-num-batched-tokens "
            f"{tokens}"
        )
        return None
    if not batch.fits(gpu):
        return None  # another build than the one the spec is for: the table's
    if (batch.max_num_seqs, batch.max_num_batched_tokens) != (seqs, tokens):
        print(
            f"vLLM's defaults, as vLLM {environment.vllm_version()} gives them here: "
            f"max-num-seqs {batch.max_num_seqs}, max-num-batched-tokens "
            f"{batch.max_num_batched_tokens} (tuner's table: {seqs}, {tokens}); the spec starts "
            "from vLLM's"
        )
    return batch


def _say_current(path: Path, current: Current) -> None:
    """What ``--current`` took from ``path``, in a line or two."""
    names = ", ".join(f"{k}={v}" for k, v in current.engine_args.items()) or "no engine argument"
    print(
        f"baseline: your configuration from {path} ({names}); vLLM's defaults measured beside "
        "it as candidate 0, both measured again as often as the search's finalist"
    )
    if current.left_out:
        print(
            f"left out of it: {', '.join(current.left_out)} (the server's, not the engine's: "
            "tuner starts each trial's server itself)"
        )
    if current.secrets:
        print(
            f"left in {path}: {', '.join(current.secrets)} (a credential: never copied into "
            "the study; a trial's server reads HF_TOKEN from the environment)"
        )


def load_study_spec(args: argparse.Namespace, name: str, trace: Trace | None) -> StudySpec:
    """The study spec, written when absent (unless ``--spec`` names it), with the command
    line's settings over it."""
    path = spec_path(args, name)
    if args.spec is not None and not args.spec.exists():
        raise InputError(
            f"--spec {args.spec} does not exist (tuner init writes one; without --spec, tuner "
            f"run writes studies/{name}.yaml)"
        )
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
    return spec


def ready_model(spec: StudySpec) -> None:
    """The spec's stand-in model written, where it names one (``dummy_model``), said."""
    if write_dummy_model(spec):
        weights = "none saved" if random_weights(spec.engine_args) else "saved"
        print(f"wrote a {spec.dummy_model} model to {spec.model} (random weights, {weights})")


def cmd_init(args: argparse.Namespace) -> int:
    """``tuner init``: write the study spec for this trace, model and machine; run nothing."""
    name = study_of(args)
    trace = None
    source = read_source(args.trace)
    if decide_format(source, args.format, args.columns) != CONCURRENCY:
        trace = load_trace(source, args.format, **trace_options(args))
    path = spec_path(args, name)
    if path.exists():
        raise InputError(f"{path} exists: edit it, or give another --study or --spec")
    write_default_spec(args, path, trace)
    load_spec(path)
    print(f"wrote {path}: read it, edit it, then: tuner run --trace {args.trace} --study {name}")
    return 0


def set_names(spec: StudySpec) -> list[str]:
    """The engine arguments the spec sets: in ``engine_args``, the baseline and the
    candidates."""
    return [*spec.engine_args, *spec.baseline, *(n for c in spec.candidates for n in c)]


def set_values(spec: StudySpec) -> list[tuple[str, Any]]:
    """Each value an engine argument takes in some trial: as set, and each searched
    dimension's bounds, choices and vLLM's default (as the search gives them)."""
    pairs: list[tuple[str, Any]] = []
    for arguments_set in (spec.engine_args, spec.baseline, *spec.candidates):
        pairs += list(arguments_set.items())
    for dimension in spec.space:
        if dimension.kind == "categorical":
            values: list[Any] = list(dimension.choices)
        else:
            cast = int if dimension.kind == "int" else float
            values = [cast(v) for v in (dimension.low, dimension.high) if v is not None]
        if dimension.has_default:
            values.append(dimension.default)
        pairs += [(dimension.name, v) for v in values if v is not None]
    unique = {json.dumps(pair, sort_keys=True, default=str): pair for pair in pairs}
    return list(unique.values())


def check_engine_arguments(spec: StudySpec, path: Path) -> None:
    """An ``InputError`` for an engine argument the installed vLLM does not accept, or a value
    its server's parser refuses (both asked of vLLM; left to it where it cannot say)."""
    known = arguments.known_arguments()
    if known is None:
        return
    names = [*set_names(spec), *(d.name for d in spec.space)]
    unknown = arguments.unknown_arguments(dict.fromkeys(names), known)
    version = environment.vllm_version()
    if unknown:
        name, close = next(iter(unknown.items()))
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise InputError(f"{path}: {name}: not an engine argument of vLLM {version}{hint}")
    pairs = set_values(spec)
    refused = arguments.refused_values(pairs) or {}
    if refused:
        index, said = next(iter(refused.items()))
        name, value = pairs[index]
        raise InputError(f"{path}: {name}: vLLM {version} refuses {value!r}: {said}")


def for_own_server(spec: StudySpec, path: Path) -> StudySpec:
    """The spec as a study of the user's own server takes it: an argument only vLLM's OpenAI
    server reads (``SERVER_ONLY_ARGUMENTS``) is left out of the search space (said) and refused
    (an ``InputError``) where the spec sets it; the space's defaults are those of an engine built
    from AsyncEngineArgs, and the server's values it replaced a candidate
    (``_from_engine_defaults``); unchanged for vLLM's server."""
    if spec.server is None:
        return spec
    for name in set_names(spec):
        if flag_name(name) in SERVER_ONLY_ARGUMENTS:
            raise InputError(
                f"{path}: {name}: an argument of vLLM's OpenAI server, not an AsyncEngineArgs "
                "field: your server cannot take it"
            )
    spec = _from_engine_defaults(spec)
    dropped = [d.name for d in spec.space if flag_name(d.name) in SERVER_ONLY_ARGUMENTS]
    if not dropped:
        return spec
    print(
        f"search space: {', '.join(dropped)} left out: an argument of vLLM's OpenAI server, not "
        "an AsyncEngineArgs field, which your server builds its engine from"
    )
    return dataclasses.replace(spec, space=tuple(d for d in spec.space if d.name not in dropped))


def _from_engine_defaults(spec: StudySpec) -> StudySpec:
    """``engine_defaults``, said; where they replaced vLLM's OpenAI server's values, those are
    added to the candidates (said), measured right after the app's own defaults: on one H200
    the example app carried 1.77 times its defaults' capacity at the server's values with a
    wider capture range (benchmarks/results/h200-translate-app/)."""
    spec, was = engine_defaults(spec)
    if not was:
        return spec
    now = spec.vllm_defaults
    print(
        "search space: vLLM's defaults for an engine built from AsyncEngineArgs, as your server "
        "builds it: "
        + ", ".join(f"{name} {now[name]} (was {value})" for name, value in was.items())
    )
    if was in [dict(c) for c in spec.candidates]:
        return spec
    print(
        "candidates: "
        + " ".join(f"{name}={value}" for name, value in was.items())
        + " added, the values vLLM's OpenAI server takes, measured right after your server's own"
    )
    return dataclasses.replace(spec, candidates=(*spec.candidates, was))


def checked_spec(
    args: argparse.Namespace, name: str, spec: StudySpec, request_trace: bool, measures: bool
) -> StudySpec:
    """The spec as this run uses it, once the folders, the engine arguments and the objective
    are checked: for the user's own server (``for_own_server``), on vLLM's CPU build with a
    baseline that starts there (said), with ``--client-procs``; its stand-in model written last
    (``ready_model``), once nothing is left to refuse."""
    check_writable(args.configs, "--configs")
    spec = for_own_server(spec, spec_path(args, name))
    if measures:
        check_writable(args.runs, "--runs")
        check_engine_arguments(spec, spec_path(args, name))
        if environment.is_cpu_build():
            spec, note = runnable_baseline(spec, environment.host_memory())
            if note:
                print(note)
    if args.client_procs is not None:
        spec = dataclasses.replace(spec, client_procs=args.client_procs)
    objective = of_spec(spec)
    if objective.searches_rates and not request_trace:
        raise InputError(
            f"a {objective.mode} study replays a request trace at rates of its choosing; a "
            f"concurrency trace sets its own load (use --objective {DEFAULT_MODE})"
        )
    ready_model(spec)
    return spec
