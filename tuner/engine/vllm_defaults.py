"""vLLM's own defaults for its OpenAI server, read from the vLLM installed here.

vLLM picks max-num-seqs and max-num-batched-tokens when none is given from the device it opens
(``EngineArgs.get_batch_defaults``: on vLLM 0.26.0 and 0.32.0, 1024 and 8192 on an H100 or
H200, 256 and 2048 on smaller GPUs, 128 and 2048 on the CPU build). ``installed`` asks the vLLM
in this environment, in a process of its own (importing vLLM takes seconds and may open the
GPU), so that a spec ``tuner init`` writes starts its search from the values that vLLM will use,
not from tuner's own table of them (``tuner.study.plan.space``), which holds for the versions it
was measured with. The answer is kept on disk, by the Python, vLLM version and GPU it was asked
for, so that only the first ``tuner init`` of an environment waits for it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tuner.engine import environment

# Run with the Python tuner runs on, which imports the vLLM tuner starts.
SCRIPT = """
import json
from vllm.engine.arg_utils import EngineArgs
from vllm.platforms import current_platform
from vllm.usage.usage_lib import UsageContext

tokens, seqs = EngineArgs.get_batch_defaults(world_size=1)
server = UsageContext.OPENAI_API_SERVER
print(json.dumps({
    "platform": current_platform.device_type,
    "max_num_seqs": seqs[server],
    "max_num_batched_tokens": tokens[server],
}))
"""
TIMEOUT_S = 300.0


@dataclass(frozen=True)
class BatchDefaults:
    """What vLLM's OpenAI server takes where neither is given, on the ``platform`` it runs on
    (vLLM's device type: ``cuda``, ``cpu``, ...)."""

    platform: str
    max_num_seqs: int
    max_num_batched_tokens: int

    @property
    def on_cpu(self) -> bool:
        return self.platform == "cpu"

    def fits(self, gpu: bool) -> bool:
        """Whether these were asked of the build a spec is for: a GPU's (``gpu``), else the
        CPU build's."""
        return self.on_cpu != gpu

    def over(self, space: Mapping[str, Any]) -> dict[str, Any]:
        """A spec's ``search_space`` with these as max-num-seqs' and max-num-batched-tokens'
        defaults, where it has them (vLLM's own value, as a dimension's default is, inside its
        range or not)."""
        out = dict(space)
        for name, value in (
            ("max-num-seqs", self.max_num_seqs),
            ("max-num-batched-tokens", self.max_num_batched_tokens),
        ):
            if name in out:
                out[name] = {**out[name], "default": value}
        return out


@dataclass(frozen=True)
class Asked:
    """``installed``'s answer: the defaults, or why there are none."""

    defaults: BatchDefaults | None
    why_not: str = ""


def installed(device: environment.Gpu | None, cache: Path | None = None) -> Asked:
    """vLLM's defaults as the vLLM installed here gives them for ``device``, the GPU it would
    open (None: none, or the CPU build), kept in ``cache`` (by default under the user's cache
    folder); or why it did not say."""
    path = cache if cache is not None else _cache_path()
    key = _key(device)
    known = _read(path)
    held = known.get(key)
    if isinstance(held, dict):
        try:
            return Asked(BatchDefaults(**held))
        except TypeError:
            pass
    asked = _ask()
    if asked.defaults is not None:
        _write(path, {**known, key: asdict(asked.defaults)})
    return asked


def _ask() -> Asked:
    """The defaults from a process that imports vLLM; why not, where it fails."""
    try:
        done = subprocess.run(
            [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=TIMEOUT_S
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return Asked(None, f"asking vLLM failed: {exc}")
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return Asked(None, f"asking vLLM failed: {last[:200]}")
    try:
        said = json.loads(done.stdout.strip().splitlines()[-1])
        seqs, tokens = int(said["max_num_seqs"]), int(said["max_num_batched_tokens"])
        return Asked(BatchDefaults(str(said["platform"]), seqs, tokens))
    except (ValueError, KeyError, IndexError, TypeError):
        return Asked(None, f"vLLM answered what tuner cannot read: {done.stdout.strip()[-200:]}")


def _key(gpu: environment.Gpu | None) -> str:
    """What the answer depends on: the Python and its ``PYTHONPATH`` (so the vLLM it imports),
    vLLM's version, and ``gpu``, the one vLLM would open first."""
    device = "none" if gpu is None else f"{gpu.name}/{gpu.memory_mib}"
    path = os.environ.get("PYTHONPATH", "")
    return f"{sys.executable}|{path}|{environment.vllm_version()}|{device}"


def _cache_path() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tuner" / "vllm-defaults.json"


def _read(path: Path) -> dict[str, object]:
    try:
        held = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return held if isinstance(held, dict) else {}


def _write(path: Path, held: dict[str, object]) -> None:
    """Replace the cache whole (a concurrent reader sees the old file or the new one); a cache
    that cannot be written is asked again next time."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        partial.write_text(json.dumps(held, indent=1, sort_keys=True))
        partial.replace(path)
    except OSError:
        return
