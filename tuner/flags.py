"""Engine-argument names: the one place where they are translated.

A study spec may write ``max_num_seqs`` or ``max-num-seqs``; everything downstream (Optuna
parameter names, the trial's ``--config`` YAML, the emitted config) uses the dashed form that
``vllm serve`` documents, so the YAML written out is byte for byte what was measured.

A field of one of vLLM's nested configurations is named with a dot, as vLLM's own command line
does (``--compilation-config.max_cudagraph_capture_size``): the argument dashed, the field as
vLLM spells it (``compilation-config.max_cudagraph_capture_size``). In the YAML it becomes a
key of that argument's mapping; a value of None leaves it out (vLLM's default).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml

# Arguments that belong to the server process rather than the engine configuration: tuner sets
# them per trial and leaves them out of the emitted config.
SERVER_ONLY = frozenset({"host", "port"})

# Arguments of ``vllm serve`` whose values are credentials: a Hugging Face token, the key the
# server asks its clients for. tuner never copies one into a study (its spec, database, runs or
# emitted config): the serving file that holds one keeps it, and a trial's server reads the
# token from the environment (``HF_TOKEN``) as vLLM does.
SECRET_ARGUMENTS = frozenset({"hf-token", "api-key"})

COMPILATION_CONFIG = "compilation-config"
# The largest token count vLLM captures a CUDA graph for. Unset, vLLM 0.26 to 0.32 take
# min(2 x max-num-seqs, 512) (capped by max-num-batched-tokens); a step with more tokens runs
# without CUDA graphs.
MAX_CAPTURE_SIZE = f"{COMPILATION_CONFIG}.max_cudagraph_capture_size"
# Explicit sizes, an alternative to the largest size (vLLM builds the list from it).
CAPTURE_SIZES = f"{COMPILATION_CONFIG}.cudagraph_capture_sizes"
CAPTURE_FIELDS = ("max_cudagraph_capture_size", "cudagraph_capture_sizes")

# How one server spreads over GPUs (its layout, ``tuner.study.plan.layouts``): each layer split
# over this many GPUs, and this many copies of the model behind the one server.
TENSOR_PARALLEL = "tensor-parallel-size"
DATA_PARALLEL = "data-parallel-size"

LOAD_FORMAT = "load-format"
# vLLM's load format that fills the weights with random values instead of reading them.
RANDOM_WEIGHTS = "dummy"


def flag_name(name: str) -> str:
    """The dashed form of an engine argument: ``max_num_seqs`` -> ``max-num-seqs``.

    A dotted name keeps its field as vLLM spells it: ``compilation_config.cudagraph_mode`` ->
    ``compilation-config.cudagraph_mode``.
    """
    name = name.strip()
    if name.startswith("--"):
        name = name[2:]
    head, dot, field = name.partition(".")
    return head.replace("_", "-") + dot + field.replace("-", "_")


def normalize(args: Mapping[str, Any]) -> dict[str, Any]:
    """Engine arguments keyed by their dashed names, duplicates rejected."""
    out: dict[str, Any] = {}
    for key, value in args.items():
        name = flag_name(key)
        if name in out:
            raise ValueError(f"engine argument {name!r} given twice")
        out[name] = value
    return out


def nest(args: Mapping[str, Any]) -> dict[str, Any]:
    """Dotted names folded into their argument's mapping, in the order first seen.

    ``{"compilation-config.max_cudagraph_capture_size": 512}`` becomes
    ``{"compilation-config": {"max_cudagraph_capture_size": 512}}``; None values are left out,
    and so is a mapping left empty by them. A field set twice (as a dotted name and in the
    argument's own mapping) is an error.
    """
    out: dict[str, Any] = {}
    for name, value in normalize(args).items():
        head, _, field = name.partition(".")
        if not field:
            if isinstance(out.get(head), dict) and isinstance(value, Mapping):
                _merge(out[head], value, head)
            elif head in out:
                raise ValueError(f"engine argument {head!r} given twice")
            else:
                out[head] = dict(value) if isinstance(value, Mapping) else value
            continue
        section = out.setdefault(head, {})
        if not isinstance(section, dict):
            raise ValueError(f"{name!r}: engine argument {head!r} is not a mapping")
        _merge(section, {field: value}, head)
    return {
        k: ({f: v for f, v in value.items() if v is not None} if isinstance(value, dict) else value)
        for k, value in out.items()
        if not (isinstance(value, dict) and all(v is None for v in value.values()))
    }


def _merge(section: dict[str, Any], fields: Mapping[str, Any], head: str) -> None:
    for field, value in fields.items():
        if field in section:
            raise ValueError(f"{head}.{field} given twice")
        section[field] = value


def config_yaml(args: Mapping[str, Any]) -> str:
    """The ``--config`` YAML of ``vllm serve`` for these arguments, in the order given."""
    return yaml.safe_dump(nest(args), sort_keys=False, default_flow_style=False)


def sets_capture_range(args: Mapping[str, Any]) -> bool:
    """Whether these arguments set the CUDA-graph capture range (as a dotted name or in a
    ``compilation-config`` mapping)."""
    section = nest(args).get(COMPILATION_CONFIG)
    return isinstance(section, dict) and any(f in section for f in CAPTURE_FIELDS)


def random_weights(args: Mapping[str, Any]) -> bool:
    """Whether these (dashed) engine arguments run on random weights (``load-format: dummy``)."""
    return args.get(LOAD_FORMAT) == RANDOM_WEIGHTS


def field_name(name: str) -> str:
    """The ``AsyncEngineArgs`` field of an engine argument: ``max-num-seqs`` -> ``max_num_seqs``."""
    return flag_name(name).partition(".")[0].replace("-", "_")


def engine_fields_yaml(args: Mapping[str, Any]) -> str:
    """These arguments as a YAML mapping of ``AsyncEngineArgs`` fields, in the order given:
    what an application that builds its engine with ``AsyncEngineArgs(**fields)`` reads.
    Dotted names nest as in ``config_yaml``."""
    fields = {field_name(name): value for name, value in nest(args).items()}
    return yaml.safe_dump(fields, sort_keys=False, default_flow_style=False)
