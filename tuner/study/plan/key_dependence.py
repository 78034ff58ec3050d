"""vLLM's compile key of an engine configuration, computed by the installed vLLM itself.

vLLM names its torch.compile cache folder by a hash of ``VllmConfig.compute_hash()`` with the
traced code, the compiler and the environment: on one installation, two configurations with the
same config hash share one compile, and a new hash compiles again (55 to 80 s per start on the
H100). Which engine arguments enter that hash changes between versions (0.32 hashes
max-num-seqs through its scheduler config; 0.26, measured on the H100, did not), so tuner asks
the installed vLLM instead of keeping a list.

vLLM is imported in a child process (``python -m tuner.study.plan.key_dependence``), never in
tuner's own: the child reads ``{"model": ..., "configs": [...]}`` as JSON on stdin, parses each
configuration as ``--config`` YAML with the server's own argument parser, builds its
``VllmConfig`` and prints the hashes as a JSON list.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuner.engine.arguments import server_parser
from tuner.errors import TunerError
from tuner.flags import SERVER_ONLY, config_yaml
from tuner.study.plan.spec import Dimension


class CompileKeyError(TunerError):
    """vLLM could not build a configuration, or the child process failed."""


def compile_keys(
    model: str,
    configs: Sequence[Mapping[str, Any]],
    python: str = sys.executable,
    timeout_s: float = 600.0,
) -> list[str]:
    """``VllmConfig.compute_hash()`` of each configuration's engine arguments, in order."""
    request = {
        "model": model,
        "configs": [{k: v for k, v in c.items() if k not in SERVER_ONLY} for c in configs],
    }
    try:
        done = subprocess.run(
            [python, "-m", "tuner.study.plan.key_dependence"],
            input=json.dumps(request),
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired:
        raise CompileKeyError(f"vLLM's config hashing took over {timeout_s:g} s") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise CompileKeyError(f"vLLM could not hash the configurations: {last}")
    keys = json.loads(done.stdout.strip().splitlines()[-1])
    return [str(k) for k in keys]


def probe_values(dim: Dimension) -> list[Any]:
    """Values of a dimension that show whether it moves the key: its ends, or every choice."""
    if dim.kind == "categorical":
        return list(dim.choices)
    assert dim.low is not None and dim.high is not None
    cast = int if dim.kind == "int" else float
    return [cast(dim.low), cast(dim.high)]


@dataclass(frozen=True)
class KeyDependence:
    """Whether a searched argument moves vLLM's compile key, over the values probed."""

    name: str
    values: tuple[Any, ...]
    keys: tuple[str, ...]

    @property
    def changes_key(self) -> bool:
        return len(set(self.keys)) > 1


def key_dependence(
    model: str,
    bases: Sequence[Mapping[str, Any]],
    space: Sequence[Dimension],
    python: str = sys.executable,
) -> list[list[KeyDependence]]:
    """For each base configuration, each dimension's keys at its probe values, the other
    dimensions at their first value. One child process hashes every configuration."""
    configs: list[dict[str, Any]] = []
    for base in bases:
        start = {**base, **{d.name: probe_values(d)[0] for d in space}}
        for dim in space:
            configs += [{**start, dim.name: value} for value in probe_values(dim)]
    keys = iter(compile_keys(model, configs, python))
    return [
        [
            KeyDependence(dim.name, tuple(values), tuple(next(keys) for _ in values))
            for dim in space
            for values in [probe_values(dim)]
        ]
        for _ in bases
    ]


def _hash_configs(model: str, configs: Sequence[Mapping[str, Any]]) -> list[str]:
    from vllm.engine.arg_utils import AsyncEngineArgs

    try:
        parser = server_parser()
    except ImportError as exc:
        raise CompileKeyError(str(exc)) from None
    keys = []
    with tempfile.TemporaryDirectory() as folder:
        for i, args in enumerate(configs):
            path = Path(folder, f"config-{i}.yaml")
            path.write_text(config_yaml({"model": model, **args}))
            parsed = parser.parse_args(["--config", str(path)])
            vllm_config = AsyncEngineArgs.from_cli_args(parsed).create_engine_config()
            keys.append(vllm_config.compute_hash())
    return keys


def main() -> None:
    request = json.loads(sys.stdin.read())
    keys = _hash_configs(request["model"], request["configs"])
    # Last line of stdout: vLLM may print to stdout before it.
    sys.stdout.write("\n" + json.dumps(keys) + "\n")


if __name__ == "__main__":
    main()
