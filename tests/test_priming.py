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
from tuner.load.metrics import ReplayResult
from tuner.load.prompts import prompt_token_ids
from tuner.study.capacity import probes
from tuner.study.capacity.probes import CapacitySettings, measure_rate
from tuner.study.measure import trial
from tuner.study.measure.judge import Criteria
from tuner.study.setup.prepare import WARMUP_MAX_S, open_loop_replay, warmup_of
from tuner.traces.formats import load_trace
from tuner.traces.model import Request
from tuner.traces.workload import build_workload


def test_each_prompt_primes_its_leading_blocks_that_were_sent_before() -> None:
    requests = [
        Request(0.0, 40, 2, (1, 2, 3, 4)),  # 1, 2 cached, 3 not: 4 is not reached
        Request(0.1, 40, 2, (1, 2, 5)),  # 1, 2, 5: the longer chain covers (1, 2)
        Request(0.2, 25, 2, (1, 2, 5, 6)),  # 6 cached, but the prompt ends inside 5
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
    """The primes go out with the settings the window is replayed with: its history blocks
    are theirs."""
    sent: list[tuple[Sequence[Request], ReplaySettings]] = []

    def replay(url: str, reqs: Sequence[Request], settings: ReplaySettings) -> ReplayResult:
        sent.append((reqs, settings))
        hits = "vllm:prefix_cache_hits_total {}\n"
        return ReplayResult([], 0.1, hits.format(100.0), hits.format(116.0))

    monkeypatch.setattr(priming, "replay", replay)
    window = [Request(0.0, 50, 3, (4, 5, 6)), Request(0.2, 50, 3, (4, 5))]
    settings = ReplaySettings(
        "m", vocab_size=1000, block_tokens=16, seed=7, client_procs=4, cached_ids=frozenset({4, 5})
    )
    primed = priming.prime("http://x", window, settings)
    # The tokens sent, and those vLLM's counter says it found cached (16 of them).
    assert (primed.tokens, primed.found_tokens) == (32, 16.0)
    figures = primed.figures()
    assert figures["prefix_primed_tokens"] == 32 and figures["prefix_primed_found_tokens"] == 16
    ((primes, used),) = sent
    assert used.seed == 7 and used.client_procs == 1
    assert [p.hash_ids for p in primes] == [(4, 5)]
    tokens = used.prompt(0, primes[0])
    for index, request in enumerate(window):
        assert used.prompt(index, request)[:32] == tokens


def test_history_blocks_are_the_same_in_every_window_and_nothing_else_is() -> None:
    """Windows replayed with different seeds share the trace's history blocks (drawn from the
    history seed), so a cache primed for one window serves the next; their own blocks and the
    rest of their prompts differ."""
    request = Request(0.0, 56, 2, (4, 5, 6))
    history = frozenset({4, 5})
    first, second = (
        prompt_token_ids(0, request, 1000, 16, seed, history, history_seed=3) for seed in (7, 8)
    )
    assert first[:32] == second[:32]
    assert first[32:48] != second[32:48] and first[48:] != second[48:]
    # Without a history, the seed is every block's.
    assert prompt_token_ids(0, request, 1000, 16, 7)[:16] != first[:16]


def test_nothing_is_primed_where_the_trace_records_no_shared_blocks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(priming, "replay", lambda *a: pytest.fail("nothing to prime"))
    settings = ReplaySettings("m", vocab_size=1000, block_tokens=16)
    assert priming.prime("http://x", [Request(0.0, 50, 3)], settings) == priming.Primed()


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
    # 1,100 tokens hold two whole blocks of 512 and part of block 2, primed as far.
    assert [(p.hash_ids, p.input_tokens) for p in primes] == [((0, 1, 2), 1100), ((3,), 512)]
    # The whole trace as the window: nothing was sent before it.
    assert build_workload(trace, window_s=60.0, time_scale=1.0, context=4096).cached_ids == set()


def test_a_window_without_shared_blocks_primes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("timestamp,input_tokens,output_tokens\n0,10,2\n5,10,2\n5.1,10,2\n")
    workload = build_workload(load_trace(path), window_s=1.0, time_scale=1.0, context=4096)
    assert workload.cached_ids == frozenset()


@pytest.mark.parametrize(
    ("cached", "first"), [(frozenset({0, 1}), []), (frozenset(), ["reset"])], ids=["primed", "cold"]
)
def test_a_capacity_window_primes_the_cache_or_resets_it_before_its_requests(
    monkeypatch: pytest.MonkeyPatch, cached: frozenset[int], first: list[str]
) -> None:
    """A primed cache is kept from one window to the next (what it holds of the last window
    beside the trace's history came from another seed); a cold one is reset."""
    order: list[str] = []

    def step(name: str) -> Callable[[str], bool]:
        def called(url: str) -> bool:
            order.append(name)
            return True

        return called

    monkeypatch.setattr(probes, "wait_idle", step("idle"))
    monkeypatch.setattr(probes, "reset_prefix_cache", step("reset"))

    def prime(url: str, window: Sequence[Request], settings: ReplaySettings) -> priming.Primed:
        order.append(f"prime seed {settings.seed}")
        return priming.Primed(1024 * len(window))

    def replay(url, window, settings, monitor=None):
        order.append(f"replay seed {settings.seed}")
        raise _Stop

    monkeypatch.setattr(probes, "prime", prime)
    monkeypatch.setattr(probes, "replay", replay)
    window = [Request(0.5 * i, 1024, 2, (i,)) for i in range(4)]
    settings = CapacitySettings(window, period_s=2.0, probe_s=2.0)
    replay_settings = ReplaySettings("m", vocab_size=1000, block_tokens=512, cached_ids=cached)
    with pytest.raises(_Stop):
        measure_rate("http://x", settings, replay_settings, Criteria({}, {}), 2.0, index=1)
    seed = probes.SEED_STRIDE * 2
    assert order == ["idle", *first, f"prime seed {seed}", f"replay seed {seed}"]


class _Stop(Exception):
    pass


def test_a_prompt_s_last_partial_block_is_primed_as_far_as_the_longest_prompt_reaches() -> None:
    """The trace names a prompt's last block even where the prompt holds only part of it: so
    much of it is primed as the window's prompts that end there hold, and no more."""
    window = [Request(0.0, 1300, 2, (0, 1, 2)), Request(0.1, 1200, 2, (0, 1, 2))]
    (prime,) = priming.priming_requests(window, frozenset({0, 1, 2}), 512)
    assert prime.input_tokens == 1300 and prime.hash_ids == (0, 1, 2)
    # A prompt longer than its blocks primes them whole, its own tail not at all.
    (prime,) = priming.priming_requests(
        [Request(0.0, 2000, 2, (0, 1, 2))], frozenset({0, 1, 2}), 512
    )
    assert prime.input_tokens == 1536


def test_the_warm_up_shares_only_the_trace_s_history_with_the_window(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The warm-up replays the window's first requests: with the window's seed, a latency
    window would find its first prompts whole in the prefix cache. Its own seed keeps them
    apart, but for the blocks the trace sent before the window."""
    sent: list[ReplaySettings] = []
    monkeypatch.setattr(trial, "replay", lambda url, reqs, settings, monitor: sent.append(settings))
    window = [Request(0.1 * i, 64, 2, (1, 2 + i)) for i in range(3)]
    replay_settings = ReplaySettings(
        "m", vocab_size=1000, block_tokens=16, seed=11, cached_ids=frozenset({1}), history_seed=11
    )
    setup = trial.TrialSetup(
        model="m",
        requests=window,
        replay=replay_settings,
        criteria=Criteria({}, {}),
        health_timeout_s=1.0,
        warmup_requests=window[:2],
    )
    trial._warm_up("http://x", setup)
    (warm,) = sent
    for index, request in enumerate(window[:2]):
        warmed, measured = warm.prompt(index, request), replay_settings.prompt(index, request)
        assert warmed[:16] == measured[:16]  # block 1: the trace's history
        assert warmed[16:32] != measured[16:32] and warmed[32:] != measured[32:]


def test_a_primed_study_s_fingerprint_says_how_it_was_primed(tmp_path: Path) -> None:
    """A study measured with primes built one way is not continued with primes built another
    (``priming.PRIMING``); a cold one records neither."""
    rows = [(0, 1100, [0, 1, 2]), (20_000, 1100, [0, 1, 5]), (20_200, 1100, [0, 7])]
    trace = load_trace(_mooncake(tmp_path / "m.jsonl", rows))
    primed = open_loop_replay(trace, 1.0, 1.0, 4096)
    assert primed.fingerprint["primed_blocks"] == 2  # 0 and 1
    assert primed.fingerprint["priming"] == priming.PRIMING
    cold = open_loop_replay(trace, 1.0, 1.0, 4096, warm_prefix_cache=False)
    assert "primed_blocks" not in cold.fingerprint and "priming" not in cold.fingerprint


def test_the_warm_up_is_the_windows_first_requests_within_its_first_15_seconds() -> None:
    """As many of the window's first requests as the spec asks, but none sent later than
    ``WARMUP_MAX_S`` after the first: a slow trace's 200 would take minutes."""
    fast = [Request(0.05 * i, 64, 2) for i in range(300)]  # 20 req/s: 200 take 10 s
    slow = [Request(2.0 + 0.25 * i, 64, 2) for i in range(300)]  # 4 req/s: 200 take 50 s
    assert warmup_of(fast, 200) == fast[:200]
    assert warmup_of(slow, 200) == slow[: int(WARMUP_MAX_S / 0.25) + 1]
    assert warmup_of(slow, 10) == slow[:10]
    assert warmup_of(slow, 0) == []
