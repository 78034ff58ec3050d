"""The incumbent search (tuner.study.trials.incumbent): levels, the order of its proposals, and
that it climbs a landscape to its best point in few trials, never proposing a configuration
twice."""

from __future__ import annotations

import math

import pytest

from tuner.engine.environment import Gpu
from tuner.flags import MAX_CAPTURE_SIZE
from tuner.study.plan.space import gpu_search_space
from tuner.study.plan.spec import Dimension, parse_spec
from tuner.study.trials.incumbent import MAX_LEVELS, Taken, levels, next_point

SEQS = Dimension("max-num-seqs", "int", 1, 1024, log=True, default=1024, has_default=True)
TOKENS = Dimension(
    "max-num-batched-tokens", "categorical", choices=(2048, 4096, 8192, 16384), default=8192,
    has_default=True,
)  # fmt: skip
SERVERS = Dimension("api-server-count", "categorical", choices=(1, 2), default=1, has_default=True)
SHARE = Dimension("gpu-memory-utilization", "float", 0.3, 0.95, step=0.05)
RULE = [("max-num-seqs", "max-num-batched-tokens")]


def test_levels() -> None:
    assert levels(SEQS) == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
    assert levels(Dimension("n", "int", 3, 40, log=True)) == [3, 4, 8, 16, 32, 40]
    assert levels(TOKENS) == [2048, 4096, 8192, 16384]
    shares = levels(SHARE)
    assert len(shares) == MAX_LEVELS and shares[0] == 0.3 and shares[-1] == 0.95
    assert all(round((s - 0.3) / 0.05, 6).is_integer() for s in shares)
    assert levels(Dimension("n", "int", 1, 4)) == [1, 2, 3, 4]
    assert levels(Dimension("f", "float", 0.1, 0.25, step=0.05)) == [0.1, 0.15, 0.2, 0.25]


def test_from_the_defaults_one_dimension_at_a_time() -> None:
    space = [SEQS, TOKENS, SERVERS]
    baseline = Taken({}, rank=-100.0)  # vLLM's defaults: every dimension at its default
    first = next_point(space, [baseline], {d.name: d.default for d in space}, RULE)
    assert first is not None
    assert first.params == {
        "max-num-seqs": 512,
        "max-num-batched-tokens": 8192,
        "api-server-count": 1,
    }
    assert first.move == "max-num-seqs down 1"
    taken = [baseline, Taken(first.params, rank=-90.0)]
    second = next_point(space, taken, {d.name: d.default for d in space}, RULE)
    assert second is not None and second.move == "max-num-batched-tokens up 1"
    assert second.params["max-num-batched-tokens"] == 16384
    # A trial still running is taken: not proposed again.
    third = next_point(space, [*taken, Taken(second.params)], {}, RULE)
    assert third is not None and third.params["max-num-batched-tokens"] == 4096


def test_moves_from_a_better_trial() -> None:
    space = [SEQS, TOKENS, SERVERS]
    defaults = {d.name: d.default for d in space}
    better = {"max-num-seqs": 1024, "max-num-batched-tokens": 8192, "api-server-count": 2}
    taken = [Taken({}, rank=-100.0), Taken(better, rank=-150.0)]
    proposal = next_point(space, taken, defaults, RULE)
    assert proposal is not None
    assert proposal.params == {**better, "max-num-seqs": 512}


def test_without_defaults_the_search_starts_mid_range() -> None:
    space = [Dimension("max-num-seqs", "int", 1, 32), SHARE]
    proposal = next_point(space, [Taken({}, rank=1.0)], {}, RULE)
    assert proposal is not None and proposal.move == "the incumbent's levels"
    assert proposal.params["max-num-seqs"] == levels(space[0])[(len(levels(space[0])) - 1) // 2]


def test_the_rule_is_kept() -> None:
    seqs = Dimension("max-num-seqs", "int", 256, 4096, log=True, default=4096, has_default=True)
    space = [seqs, TOKENS]
    seen = [Taken({}, rank=0.0)]
    for _ in range(40):
        proposal = next_point(space, seen, {d.name: d.default for d in space}, RULE)
        if proposal is None:
            break
        assert proposal.params["max-num-batched-tokens"] >= proposal.params["max-num-seqs"]
        seen.append(Taken(proposal.params, rank=1.0))


def _landscape(params: dict) -> float:
    """A capacity: best at max-num-seqs 64, 16384 tokens, 2 API servers."""
    seqs = params["max-num-seqs"]
    return (
        100.0
        - 8.0 * abs(math.log2(seqs) - 6)
        + params["max-num-batched-tokens"] / 1024
        + 30.0 * (params["api-server-count"] - 1)
    )


def test_climbs_to_the_best_without_repeating() -> None:
    space = [SEQS, TOKENS, SERVERS]
    defaults = {d.name: d.default for d in space}
    best = max(
        _landscape({"max-num-seqs": s, "max-num-batched-tokens": t, "api-server-count": a})
        for s in levels(SEQS)
        for t in levels(TOKENS)
        for a in levels(SERVERS)
    )
    taken = [Taken({}, rank=-_landscape(defaults))]
    proposed = []
    reached = None
    while True:
        proposal = next_point(space, taken, defaults, RULE)
        if proposal is None:
            break
        proposed.append(tuple(proposal.params.values()))
        value = _landscape(proposal.params)
        taken.append(Taken(proposal.params, rank=-value))
        if reached is None and value >= 0.95 * best:
            reached = len(taken)
    assert len(proposed) == len(set(proposed))
    assert reached is not None and reached <= 12, reached
    # Every one-dimension move around the best is measured before the search gives up.
    assert len(proposed) >= 10


def test_a_direction_that_lost_twice_in_a_row_waits_for_the_rest() -> None:
    # The CPU landscape's order: max-num-seqs 16 leads, 8 and 4 lost to it; 2 and 1 are passed
    # over for the two-dimension moves and the refinements, then proposed, so nothing is lost.
    seqs = Dimension("max-num-seqs", "int", 1, 32, log=True)
    tokens = Dimension("max-num-batched-tokens", "categorical", choices=(512, 2048, 8192))
    space = [seqs, tokens]
    measured = {(16, 2048): 4.8, (32, 2048): 3.7, (8, 2048): 3.7, (16, 8192): 4.4, (16, 512): 4.7}
    taken = [
        Taken({"max-num-seqs": s, "max-num-batched-tokens": t}, rank=-capacity)
        for (s, t), capacity in measured.items()
    ]
    proposal = next_point(space, taken, {}, RULE)
    assert proposal is not None and proposal.move == "max-num-seqs down 2"  # one loss: go on
    taken.append(Taken(proposal.params, rank=-2.2))
    moves = []
    while (proposal := next_point(space, taken, {}, RULE)) is not None:
        moves.append(proposal.move)
        taken.append(Taken(proposal.params, rank=0.0))
    assert moves[:4] == ["max-num-seqs and max-num-batched-tokens together"] * 4
    assert moves[-2:] == ["max-num-seqs down 3", "max-num-seqs down 4"], moves
    assert all(not m.startswith("max-num-seqs down") for m in moves[:-2]), moves


@pytest.mark.parametrize("rank", [None, 5.0])
def test_nothing_left(rank: float | None) -> None:
    space = [SERVERS]
    taken = [Taken({}, rank=0.0), Taken({"api-server-count": 2}, rank=rank)]
    assert next_point(space, taken, {"api-server-count": 1}, RULE) is None
    assert next_point([], taken, {}, RULE) is None


def test_a_default_in_range_is_a_level() -> None:
    share = Dimension("gpu-memory-utilization", "float", 0.3, 0.95, step=0.05, default=0.9,
                      has_default=True)  # fmt: skip
    assert 0.9 in levels(share) and levels(share) == sorted(levels(share))
    outside = Dimension("max-num-seqs", "int", 1, 32, log=True, default=128, has_default=True)
    assert levels(outside) == [1, 2, 4, 8, 16, 32]


def test_the_gpu_space_starts_with_a_move_not_a_copy_of_the_defaults() -> None:
    """On a large GPU every dimension of tuner's default space has vLLM's value as a level, so
    the baseline is the incumbent's levels, and trial 1 is already a move."""
    spec = parse_spec(
        {"search_space": gpu_search_space([50, 100, 200], Gpu(0, "GPU-0", "NVIDIA H100", 81559))}
    )
    defaults = {d.name: d.default for d in spec.space if d.has_default}
    assert set(defaults) == {d.name for d in spec.space}
    proposal = next_point(spec.space, [Taken({}, rank=-100.0)], defaults, RULE)
    assert proposal is not None and proposal.move == "api-server-count up 1"
    assert proposal.params == {**defaults, "api-server-count": 2}
    # The front end first, the KV-cache share last (the order of the search's moves).
    names = [d.name for d in spec.space]
    assert names[0] == "api-server-count" and names[-1] == "gpu-memory-utilization"


def test_with_long_prompts_the_first_move_is_max_num_batched_tokens_down_to_2048() -> None:
    """Where prompts are long, the chunk size moves first and down: 2048 carried 1.35 times what
    vLLM's 8192 did on the Azure code trace while 16384 carried the same, and a study that tried
    16384 first ran out of time before 2048 (benchmarks/results/h200-code-7b/)."""
    h200 = Gpu(0, "GPU-0", "NVIDIA H200", 143771)
    spec = parse_spec({"search_space": gpu_search_space([1859] * 4, h200)})
    defaults = {d.name: d.default for d in spec.space if d.has_default}
    baseline = Taken({}, rank=-100.0)
    first = next_point(spec.space, [baseline], defaults, RULE)
    assert first is not None and first.move == "max-num-batched-tokens down 1"
    assert first.params == {**defaults, "max-num-batched-tokens": 2048}
    # Where 2048 lost, the other way: up to 16384, named by its value.
    second = next_point(spec.space, [baseline, Taken(first.params, rank=-90.0)], defaults, RULE)
    assert second is not None and second.move == "max-num-batched-tokens up 1"
    assert second.params["max-num-batched-tokens"] == 16384


def test_in_the_gpu_space_either_front_end_move_leads_to_the_pair() -> None:
    """Two API servers and a capture range wider than vLLM's default measured well together
    and not apart (benchmarks/results/h200-asc-capture/): whichever of the two moves becomes
    the incumbent, the next proposal is the pair; where neither does, the range moves next."""
    spec = parse_spec(
        {"search_space": gpu_search_space([50, 100, 200], Gpu(0, "GPU-0", "NVIDIA H100", 81559))}
    )
    defaults = {d.name: d.default for d in spec.space if d.has_default}
    # vLLM's range at its default max-num-seqs (1024) is 512, a level among the others.
    assert defaults[MAX_CAPTURE_SIZE] == 512
    baseline = Taken({}, rank=-100.0)
    two_servers = {**defaults, "api-server-count": 2}
    wider = {**defaults, MAX_CAPTURE_SIZE: 1024}
    pair = {**defaults, "api-server-count": 2, MAX_CAPTURE_SIZE: 1024}

    won = next_point(spec.space, [baseline, Taken(two_servers, rank=-150.0)], defaults, RULE)
    assert won is not None and won.params == pair
    lost = next_point(spec.space, [baseline, Taken(two_servers, rank=-90.0)], defaults, RULE)
    assert lost is not None and lost.params == wider
    widened = [baseline, Taken(two_servers, rank=-90.0), Taken(wider, rank=-110.0)]
    after = next_point(spec.space, widened, defaults, RULE)
    assert after is not None and after.params == pair
