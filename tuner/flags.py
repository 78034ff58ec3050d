"""Engine-argument names: the one place where they are translated.

A study spec may write ``max_num_seqs`` or ``max-num-seqs``; everything downstream (Optuna
parameter names, the trial's ``--config`` YAML, the emitted config) uses the dashed form that
``vllm serve`` documents, so the YAML written out is byte for byte what was measured.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml

# Arguments that belong to the server process rather than the engine configuration: tuner sets
# them per trial and leaves them out of the emitted config.
SERVER_ONLY = frozenset({"host", "port"})


def flag_name(name: str) -> str:
    """The dashed form of an engine argument: ``max_num_seqs`` -> ``max-num-seqs``."""
    name = name.strip()
    if name.startswith("--"):
        name = name[2:]
    return name.replace("_", "-")


def normalize(args: Mapping[str, Any]) -> dict[str, Any]:
    """Engine arguments keyed by their dashed names, duplicates rejected."""
    out: dict[str, Any] = {}
    for key, value in args.items():
        name = flag_name(key)
        if name in out:
            raise ValueError(f"engine argument {name!r} given twice")
        out[name] = value
    return out


def config_yaml(args: Mapping[str, Any]) -> str:
    """The ``--config`` YAML of ``vllm serve`` for these arguments, in the order given."""
    return yaml.safe_dump(normalize(args), sort_keys=False, default_flow_style=False)
