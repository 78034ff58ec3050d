"""vLLM's compile key, from the installed vLLM's own config hashing (the CPU build's here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuner.flags import MAX_CAPTURE_SIZE
from tuner.study.plan.key_dependence import key_dependence, probe_values
from tuner.study.plan.spec import Dimension


def test_probe_values_are_the_ends_or_every_choice():
    assert probe_values(Dimension("a", "int", 1, 32)) == [1, 32]
    assert probe_values(Dimension("b", "float", 0.1, 0.9, 0.1)) == [0.1, 0.9]
    assert probe_values(Dimension("c", "categorical", choices=(None, 256))) == [None, 256]


@pytest.mark.vllm
def test_vllm_hashes_batched_tokens_and_capture_sizes_but_not_memory_share(cpu_model: Path):
    """One child process imports vLLM and hashes every configuration."""
    base = {"load-format": "dummy", "max-model-len": 4096, "max-num-batched-tokens": 2048}
    space = [
        Dimension("gpu-memory-utilization", "float", 0.1, 0.3, 0.1),
        Dimension("max-num-batched-tokens", "categorical", choices=(2048, 4096)),
        Dimension(MAX_CAPTURE_SIZE, "categorical", choices=(None, 64)),
    ]
    (found,) = key_dependence(str(cpu_model), [base], space)
    by_name = {dep.name: dep for dep in found}
    assert not by_name["gpu-memory-utilization"].changes_key
    assert by_name["max-num-batched-tokens"].changes_key
    # (An explicit cudagraph_capture_sizes list is not tried: the CPU build empties it, having
    # no CUDA graphs, so there it does not move the key; the largest size is kept, and does.)
    assert by_name[MAX_CAPTURE_SIZE].changes_key
    # Each key is vLLM's: a hex digest, and the same configuration hashes the same.
    keys = by_name["gpu-memory-utilization"].keys
    assert keys[0] == keys[1] and int(keys[0], 16) >= 0
