"""Priming the prefix cache with what the trace sent before its window: which blocks, which
prompts, and that a capacity window sends them before its own requests. No server: the replay
is recorded (tests/test_priming_vllm.py primes vLLM's CPU build and reads its cache hits)."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from tuner.load import priming
from tuner.load.http import ReplaySettings
from tuner.load.prompts import prompt_token_ids
from tuner.study.measure import capacity
from tuner.study.measure.capacity import CapacitySettings, measure_rate
from tuner.traces.formats import load_trace
from tuner.traces.model import Request
from tuner.traces.workload import build_workload


def test_each_prompt_primes_its_leading_blocks_that_were_sent_before() -> None:
    requests = [
        Request(0.0, 40, 2, (1, 2, 3, 4)),  # 1, 2 cached, 3 not: 4 is not reached
        Request(0.1, 40, 2, (1, 2, 5)),  # 1, 2, 5: the longer chain covers (1, 2)
        Request(0.2, 25, 2, (1, 2, 5, 6)),  # 6 cached, but the prompt holds 2 whole blocks
        Request(0.3, 40, 2, (7, 8)),  # nothing cached
        Request(0.4, 30, 2, (9,)),  # cached alone
        Request(0.5, 30, 2, ()),  # no shared blocks
    ]
    cached = frozenset({1, 2, 5, 6, 9})
    primes = priming.priming_requests(requests, cached, block_tokens=10)
    assert [(p.hash_ids, p.input_tokens, p.output_tokens) for p in primes] == [
        ((1, 2, 5), 30, 1),
        ((9,), 10, 1),
    ]
    assert all(p.arrival_s == 0.0 for p in primes)
    assert priming.priming_requests(requests, frozenset(), 10) == []
    assert priming.priming_requests(requests, cached, 0) == []


def test_a_prime_s_prompt_is_the_window_prompt_s_leading_blocks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Equal ids give equal tokens only with the same seed: the primes go out with the
    settings the window is replayed with."""
    sent: list[tuple[Sequence[Request], ReplaySettings]] = []
    monkeypatch.setattr(
        priming, "replay", lambda url, reqs, settings: sent.append((reqs, settings))
    )
    window = [Request(0.0, 50, 3, (4, 5, 6)), Request(0.2, 50, 3, (4, 5))]
    settings = ReplaySettings(
        "m", vocab_size=1000, block_tokens=16, seed=7, client_procs=4, cached_ids=frozenset({4, 5})
    )
    assert priming.prime("http://x", window, settings) == 32
    ((primes, used),) = sent
    assert used.seed == 7 and used.client_procs == 1
    assert [p.hash_ids for p in primes] == [(4, 5)]
    primed = prompt_token_ids(0, primes[0], 1000, 16, used.seed)
    for index, request in enumerate(window):
        assert prompt_token_ids(index, request, 1000, 16, used.seed)[:32] == primed


def test_nothing_is_primed_where_the_trace_records_no_shared_blocks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(priming, "replay", lambda *a: pytest.fail("nothing to prime"))
    settings = ReplaySettings("m", vocab_size=1000, block_tokens=16)
    assert priming.prime("http://x", [Request(0.0, 50, 3)], settings) == 0


def _mooncake(path: Path, rows: list[tuple[int, int, list[int]]]) -> Path:
    path.write_text(
        "".join(
            json.dumps({"timestamp": t, "input_length": n, "output_length": 4, "hash_ids": h})
            + "\n"
            for t, n, h in rows
        )
    )
    return path


def test_the_window_s_blocks_sent_before_it_are_those_to_prime(tmp_path: Path) -> None:
    # Two quiet requests at 0 and 10 s, then the busy second at 20 s: of its blocks, 0 to 3
    # were sent before it, 5, 6 and 7 were not (7 repeats inside the window only).
    trace = load_trace(
        _mooncake(
            tmp_path / "m.jsonl",
            [
                (0, 1100, [0, 1, 2]),
                (10_000, 1100, [3, 4]),
                (20_000, 1100, [0, 1, 5]),
                (20_200, 1100, [3, 7]),
                (20_400, 1100, [6, 7]),
                (20_600, 1100, [0, 1, 2]),
            ],
        )
    )
    workload = build_workload(trace, window_s=1.0, time_scale=1.0, context=4096)
    assert len(workload.trace) == 4 and workload.start_s == 20.0
    assert workload.cached_ids == {0, 1, 2, 3}
    primes = priming.priming_requests(workload.trace.requests(), workload.cached_ids, 512)
    # 1,100 tokens hold two whole blocks of 512: block 2 is not primed.
    assert [p.hash_ids for p in primes] == [(0, 1), (3,)]
    # The whole trace as the window: nothing was sent before it.
    assert build_workload(trace, window_s=60.0, time_scale=1.0, context=4096).cached_ids == set()


def test_a_window_without_shared_blocks_primes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("timestamp,input_tokens,output_tokens\n0,10,2\n5,10,2\n5.1,10,2\n")
    workload = build_workload(load_trace(path), window_s=1.0, time_scale=1.0, context=4096)
    assert workload.cached_ids == frozenset()


def test_a_capacity_window_primes_the_cache_after_its_reset_and_before_its_requests(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    order: list[str] = []

    def step(name: str) -> Callable[[str], bool]:
        def called(url: str) -> bool:
            order.append(name)
            return True

        return called

    monkeypatch.setattr(capacity, "wait_idle", step("idle"))
    monkeypatch.setattr(capacity, "reset_prefix_cache", step("reset"))

    def prime(url: str, window: Sequence[Request], settings: ReplaySettings) -> int:
        order.append(f"prime seed {settings.seed}")
        return 1024 * len(window)

    def replay(url, window, settings, monitor=None):
        order.append(f"replay seed {settings.seed}")
        raise _Stop

    monkeypatch.setattr(capacity, "prime", prime)
    monkeypatch.setattr(capacity, "replay", replay)
    window = [Request(0.5 * i, 1024, 2, (i,)) for i in range(4)]
    settings = CapacitySettings(window, period_s=2.0, rate_window_s=2.0)
    replay_settings = ReplaySettings("m", vocab_size=1000, block_tokens=512)
    with pytest.raises(_Stop):
        measure_rate("http://x", settings, replay_settings, {}, {}, 2.0, index=1)
    seed = capacity.SEED_STRIDE * 2
    assert order == ["idle", "reset", f"prime seed {seed}", f"replay seed {seed}"]


class _Stop(Exception):
    pass


def test_prime_tokens_are_counted_in_whole_blocks() -> None:
    request = Request(0.0, 1300, 2, (0, 1, 2))
    (prime,) = priming.priming_requests([request], frozenset({0, 1, 2}), 512)
    assert prime.input_tokens == 1024 and prime.hash_ids == (0, 1)
