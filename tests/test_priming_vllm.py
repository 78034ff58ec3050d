"""Priming vLLM's prefix cache, on vLLM's CPU build: a window whose prompts begin with blocks
the trace sent before it finds them in the cache once primed, and not otherwise, and the next
window's priming finds them there already, by vLLM's own counters
(``vllm:prefix_cache_hits_total`` over ``..._queries_total``). One engine start."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from conftest import served

from tuner.load.http import ReplaySettings
from tuner.study.capacity.probes import CapacitySettings, measure_rate
from tuner.study.measure.judge import Criteria
from tuner.traces.model import Request
from tuner.traces.workload import model_info

BLOCK = 256


@pytest.mark.vllm
def test_a_primed_window_finds_its_earlier_blocks_in_vllm_s_prefix_cache(
    tiny_model: Path, tmp_path: Path
) -> None:
    config = tmp_path / "serve.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "model": str(tiny_model),
                "max-model-len": 2048,
                # A size, not a share: a share of a NUMA node's memory (10 GiB on one 2-core
                # machine) below what the worker holds leaves the KV cache nothing.
                "kv-cache-memory-bytes": 1 << 28,
                "enable-prefix-caching": True,
                # No compile: a fresh model folder compiles anew (minutes on two cores).
                "enforce-eager": True,
            }
        )
    )
    # Four prompts of four blocks: three each that the trace sent before the window (no two
    # prompts share one), then one of its own.
    window = [
        Request(0.25 * i, 4 * BLOCK, 2, (100 + 10 * i, 101 + 10 * i, 102 + 10 * i, 900 + i))
        for i in range(4)
    ]
    before = frozenset(h for r in window for h in r.hash_ids[:3])
    settings = CapacitySettings(window, period_s=1.0, probe_s=1.0, min_requests=0)
    vocab = model_info(str(tiny_model), 2048).vocab_size
    cold = ReplaySettings(str(tiny_model), vocab, BLOCK, request_timeout_s=120, drain_timeout_s=120)
    primed = replace(cold, cached_ids=before, history_seed=5)
    with served(config, tmp_path, {"VLLM_SERVER_DEV_MODE": "1"}) as url:
        points = {
            name: measure_rate(url, settings, replay_settings, Criteria({}, {}), 4.0, index)
            for index, (name, replay_settings) in enumerate(
                [("cold", cold), ("primed", primed), ("primed again", primed)]
            )
        }
    shares = {}
    for name, point in points.items():
        figures = point.figures
        assert figures["requests"] == 4, figures
        shares[name] = figures["server_prefix_cache_hits"] / figures["server_prefix_cache_queries"]
    # Cold, the cache is reset before the window; primed, it is kept for the next window.
    assert [p.figures["prefix_cache_reset"] for p in points.values()] == [1.0, 0.0, 0.0]
    assert points["cold"].figures["prefix_primed_tokens"] == 0
    sent = 4 * 3 * BLOCK
    found = {}
    for name in ("primed", "primed again"):
        assert points[name].figures["prefix_primed_tokens"] == sent
        found[name] = points[name].figures["prefix_primed_found_tokens"] / sent
    # Three of each prompt's four blocks were primed: about 3/4 of its tokens hit, less the
    # last partial block vLLM does not cache; cold, none of them. The second window draws its
    # own blocks from another seed, but its history blocks are the first one's.
    assert shares["cold"] < 0.05, shares
    assert shares["primed"] > 0.6 and shares["primed again"] > 0.6, shares
    # The first priming found none of its blocks cached; the second found them all but the
    # last of each prime, which vLLM computes again to answer it.
    assert found["primed"] < 0.05 and found["primed again"] > 0.6, found
