"""The capacity search: the rate search alone, the window at a rate, the lost-SLO rule, and the
whole measurement against a stand-in server whose capacity is known (in-process, seconds).

The stand-in's latency rises sharply above a known rate: it answers a request's first token
after ``FAST_S`` while the arrival rate since the window began (since the capacity search's
``/reset_prefix_cache``) is at most ``CAPACITY_REQ_PER_S``, after ``SLOW_S`` once it is above.
Judging the rate over the whole window, not by real queueing, keeps the known capacity known on
a loaded machine, where a queueing stand-in's latencies moved with the machine's.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import math
import random
import re
import threading
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
from cap_load import CAP_WINDOW_S, CapLoad
from conftest import run_tuner, write_small_trace, write_spec
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from optuna.distributions import FloatDistribution, IntDistribution
from optuna.trial import TrialState

from tuner.cli.exits import EXIT_FAILED, EXIT_MEETS_SLOS, EXIT_MISSES_SLOS
from tuner.cli.main import main
from tuner.errors import InputError
from tuner.load.health import CLIENT_BEHIND
from tuner.load.http import ReplaySettings
from tuner.load.metrics import LiveRequest, ReplayResult, RequestResult
from tuner.study.capacity import probes
from tuner.study.capacity.lost import lost_slos
from tuner.study.capacity.probes import (
    CAPACITY_FAILED,
    MAX_SPAN,
    MIN_WINDOW_REQUESTS,
    CapacitySettings,
    StartHint,
    after_lead_in,
    capacity_score,
    measure_capacity,
    measure_rate,
    measure_saturated,
    sustained,
)
from tuner.study.capacity.rate_search import RateSearch, start_hint
from tuner.study.capacity.rates import (
    COMPLETED,
    SATURATING,
    SUSTAINED,
    RatePoint,
    hinted_step,
    search_capacity,
)
from tuner.study.capacity.text import num
from tuner.study.measure.trial import Criteria, Ended, TrialOutcome, TrialSetup
from tuner.study.plan.spec import parse_spec
from tuner.study.result.words import words_of
from tuner.study.setup.objective import CAPACITY_OBJECTIVE
from tuner.study.store import record
from tuner.study.store.record import ARGS_ATTR, CAPACITY_ATTR, CONFIRMS_ATTR, POINTS_ATTR
from tuner.study.trials.confirm import confirm
from tuner.study.trials.search import Measuring, open_study, run_study
from tuner.traces.model import Request
from tuner.traces.workload import at_rate

CAPACITY_REQ_PER_S = 10.0
FAST_S = 0.02
SLOW_S = 1.0
# Requests before the stand-in judges the rate: the first few gaps say little of it.
JUDGED_FROM = 10


# --- the rate search alone --------------------------------------------------------------


def threshold(true_req_per_s: float, calls: list[float]):
    def measure(rate: float) -> RatePoint:
        calls.append(rate)
        return RatePoint(rate, rate <= true_req_per_s)

    return measure


@pytest.mark.parametrize("true_req_per_s", [0.37, 1.0, 3.3, 9.9, 41.0])
@pytest.mark.parametrize("resolution", [0.05, 0.1, 0.25])
def test_the_search_lands_within_the_resolution(true_req_per_s, resolution):
    calls: list[float] = []
    found = search_capacity(threshold(true_req_per_s, calls), 3.0, resolution, max_probes=20)
    assert found.resolved
    assert found.capacity_req_per_s <= true_req_per_s
    assert found.capacity_req_per_s * (1 + resolution) >= true_req_per_s
    assert len(found.points) == len(calls)
    assert [p.rate_req_per_s for p in found.points] == calls
    # The bracket takes one window per doubling or halving from the start, the bisection
    # log2(log 2 / log(1 + resolution)) rounded up.
    bracket = 2 + math.floor(abs(math.log2(true_req_per_s / 3.0)))
    bisect = math.ceil(math.log2(math.log(2) / math.log(1 + resolution)))
    assert len(calls) <= bracket + bisect


def test_the_search_stops_at_its_window_limit_and_floor():
    calls: list[float] = []
    found = search_capacity(threshold(100.0, calls), 1.0, 0.1, max_probes=4)
    assert not found.resolved and len(calls) == 4
    assert found.capacity_req_per_s == 8.0  # 1, 2, 4, 8 passed
    assert "probe limit" in found.why_stopped

    calls = []
    found = search_capacity(threshold(0.01, calls), 1.0, 0.1, floor_req_per_s=0.2)
    assert found.capacity_req_per_s == 0.0 and not found.resolved
    assert calls == [1.0, 0.5, 0.25, 0.2]  # the floor itself, where halving 0.25 skips it
    assert "floor" in found.why_stopped


def test_a_capacity_between_the_floor_and_the_last_halving_is_found():
    """0.25 req/s failed and halving it would skip the floor (0.2): the floor is measured, and
    from its pass the search bisects as from any bracket."""
    calls: list[float] = []
    found = search_capacity(threshold(0.22, calls), 1.0, 0.1, floor_req_per_s=0.2)
    assert calls[:4] == [1.0, 0.5, 0.25, 0.2]
    assert found.resolved, found.why_stopped
    assert 0.2 <= found.capacity_req_per_s <= 0.22 < found.capacity_req_per_s * 1.1


@pytest.mark.parametrize("ratio", [0.83, 0.9, 1.0, 1.1, 1.2])
def test_a_re_measurement_near_its_own_capacity_takes_three_windows(ratio):
    """From the configuration's own capacity, a capacity within 21 % of it (one configuration
    measured twice differs by 10 to 20 %) is resolved in 3 windows; doubling from there takes 5."""
    calls: list[float] = []
    step = hinted_step(0.1)
    found = search_capacity(threshold(10.0 * ratio, calls), 10.0, 0.1, first_step=step)
    assert found.resolved and len(calls) == 3
    assert found.capacity_req_per_s <= 10.0 * ratio < found.capacity_req_per_s * 1.1
    doubling = search_capacity(threshold(10.0 * ratio, []), 10.0, 0.1)
    assert len(doubling.points) == 5


@pytest.mark.parametrize("true_req_per_s", [0.37, 1.0, 2.0, 3.3, 5.9, 9.9, 41.0])
@pytest.mark.parametrize("resolution", [0.05, 0.1, 0.25])
def test_a_hinted_search_far_off_still_lands_and_costs_at_most_two_windows_more(
    true_req_per_s, resolution
):
    calls: list[float] = []
    step = hinted_step(resolution)
    found = search_capacity(threshold(true_req_per_s, calls), 3.0, resolution, 30, first_step=step)
    assert found.resolved
    assert found.capacity_req_per_s <= true_req_per_s
    assert found.capacity_req_per_s * (1 + resolution) >= true_req_per_s
    doubling = search_capacity(threshold(true_req_per_s, []), 3.0, resolution, 30)
    assert len(calls) <= len(doubling.points) + (3 if resolution < 0.1 else 2)


# --- the first search: a saturating window, then bisection below its throughput ----------


def saturating(true_req_per_s: float, sustained_req_per_s: float, calls: list[float]):
    """A server that carries ``true_req_per_s`` and completes at most ``sustained_req_per_s``
    a second: a saturating window offered above that reads it, one offered below reads what
    was offered; and, as any window, it passes at or below the capacity."""

    def saturate(rate: float) -> RatePoint:
        calls.append(rate)
        sustained = min(rate, sustained_req_per_s)
        return RatePoint(rate, rate <= true_req_per_s, {SUSTAINED: sustained})

    return saturate


def first_search(true_req_per_s, share, resolution, start, max_probes=10, floor_req_per_s=0.0):
    """The search of a study's first trial on a server whose capacity is ``share`` of the
    throughput it sustains; the rates tried, the saturating window's first."""
    calls: list[float] = []
    sustained = true_req_per_s / share
    found = search_capacity(
        threshold(true_req_per_s, calls), start, resolution, max_probes, floor_req_per_s,
        saturate=saturating(true_req_per_s, sustained, calls),
    )  # fmt: skip
    return found, calls


def lands(found, true_req_per_s: float, resolution: float) -> bool:
    capacity = found.capacity_req_per_s
    within = capacity * (1 + resolution) * (1 + 1e-9)  # a rate on the boundary, rounded
    return found.resolved and capacity <= true_req_per_s < within


@given(
    true_req_per_s=st.floats(0.5, 500.0),
    resolution=st.sampled_from([0.05, 0.1, 0.15, 0.25]),
    place=st.floats(1e-6, 1.0, exclude_max=True),
    start_below=st.floats(1.0, SATURATING),
)
@settings(max_examples=400, deadline=None)
def test_a_first_search_reaches_a_capacity_near_its_throughput_in_four_windows(
    true_req_per_s, resolution, place, start_below
):
    """A capacity from ``(1 + resolution) ** -6`` of the sustained throughput up to it (0.56
    at 10 %) is resolved in 4 windows, the saturating one included, from any start the
    saturating window offers far enough above."""
    lowest_share = (1 + resolution) ** -6
    share = lowest_share * (1 / lowest_share) ** place  # log-uniform over the shares covered
    assume(share < 1 / (1 + 1e-6))
    start = true_req_per_s / share / start_below  # 32 times it is above the throughput
    found, calls = first_search(true_req_per_s, share, resolution, start)
    assert lands(found, true_req_per_s, resolution), (calls, found.why_stopped)
    assert len(calls) <= 4 and len(found.points) == len(calls)
    assert calls[0] == pytest.approx(start * SATURATING)
    assert found.points[0].figures[SUSTAINED] > 0


@given(
    true_req_per_s=st.floats(0.5, 500.0),
    resolution=st.sampled_from([0.05, 0.1, 0.25]),
    offered_above=st.floats(1.0 + 1e-6, 1.0 / 0.6),
)
@settings(max_examples=200, deadline=None)
def test_a_first_search_that_offered_too_little_to_saturate_bisects_below_what_it_offered(
    true_req_per_s, resolution, offered_above
):
    """Offered below the throughput (the server kept up, and failed its SLOs): the window's own
    rate bounds the capacity, and one within 0.6 of it is resolved in 4 windows."""
    lowest = (1 + resolution) ** -7
    assume(1 / offered_above >= lowest)
    start = true_req_per_s * offered_above / SATURATING
    found, calls = first_search(true_req_per_s, 0.1, resolution, start)
    assert lands(found, true_req_per_s, resolution), (calls, found.why_stopped)
    assert len(calls) <= 4


@given(
    true_req_per_s=st.floats(0.5, 500.0),
    resolution=st.sampled_from([0.05, 0.1, 0.25]),
    share=st.floats(0.1, 1.5),
    start=st.floats(0.1, 100.0),
)
@settings(max_examples=400, deadline=None)
def test_a_first_search_lands_wherever_its_capacity_and_start_are(
    true_req_per_s, resolution, share, start
):
    """Far below its throughput (down to a tenth of it), above the saturating window's rate,
    or with the throughput read low (a share above 1: the bound is measured before it is
    believed, so it caps nothing): the capacity is still resolved, in at most 5 windows more
    than without the saturating window."""
    found, calls = first_search(true_req_per_s, share, resolution, start, max_probes=40)
    assert lands(found, true_req_per_s, resolution), (calls, found.why_stopped)
    plain = search_capacity(threshold(true_req_per_s, []), start, resolution, 40)
    assert len(calls) <= len(plain.points) + 5, calls


@given(
    true_req_per_s=st.floats(0.5, 500.0),
    resolution=st.sampled_from([0.05, 0.1, 0.25]),
    read_low=st.floats(1.0, 5.0),
    floor_share=st.floats(0.05, 0.95),
)
@settings(max_examples=300, deadline=None)
def test_a_throughput_read_far_low_near_the_floor_caps_nothing(
    true_req_per_s, resolution, read_low, floor_share
):
    """A saturating window still filling the engine in its second half reads far less than it
    sustains (vLLM's CPU build, flooded at 32 times the window's rate, read 0.67 req/s where
    the window's own rate passed): the bound, near the floor, is measured before it is
    believed, and the capacity is found above it."""
    floor = true_req_per_s * floor_share
    found, calls = first_search(
        true_req_per_s, read_low, resolution, start=true_req_per_s, max_probes=40,
        floor_req_per_s=floor,
    )  # fmt: skip
    assert lands(found, true_req_per_s, resolution), (calls, found.why_stopped)


def test_the_cpu_build_s_flooded_window_is_measured_past():
    """The case above as it happened: 2.24 req/s the window's rate, 0.667 read, the floor 0.667
    (10 requests in 15 s): the floor and the bound pass, and the search grows from there."""
    calls: list[float] = []
    found = search_capacity(
        threshold(2.0, calls), 2.24, 0.1, 10, 10 / 15,
        saturate=saturating(2.0, 2.0 / 3.0, calls),
    )  # fmt: skip
    bound = 2.0 / 3.0 * 1.1
    assert calls[:3] == [pytest.approx(71.68), pytest.approx(bound), pytest.approx(bound * 1.21)]
    assert lands(found, 2.0, 0.1), (calls, found.why_stopped)


def test_the_saturating_window_is_a_point_and_counts_against_the_window_limit():
    """Offered 32 req/s, 20 sustained: the bound is 22 req/s (one resolution up), and the
    bisection's first rate the middle of 22 / 1.1 ** 8 and 22 on a log scale."""
    calls: list[float] = []
    found = search_capacity(
        threshold(10.0, calls), 1.0, 0.1, max_probes=2,
        saturate=saturating(10.0, 20.0, calls),
    )  # fmt: skip
    assert calls == [32.0, pytest.approx(22.0 / 1.1**4)] and not found.resolved
    assert found.points[0].figures[SUSTAINED] == 20.0 and not found.points[0].passed
    assert "probe limit (2)" in found.why_stopped


def test_a_saturating_window_whose_client_may_be_to_blame_bounds_nothing():
    """Its failure may be tuner's client's: the search starts from the start as without it,
    one window later."""
    calls: list[float] = []

    def behind(rate: float) -> RatePoint:
        calls.append(rate)
        return RatePoint(rate, False, {SUSTAINED: 3.0}, "saturating window", "client 2 s late")

    found = search_capacity(threshold(10.0, calls), 4.0, 0.1, 10, saturate=behind)
    plain = search_capacity(threshold(10.0, []), 4.0, 0.1, 10)
    assert calls[:2] == [128.0, 4.0]
    assert [p.rate_req_per_s for p in found.points[1:]] == [p.rate_req_per_s for p in plain.points]
    assert found.capacity_req_per_s == plain.capacity_req_per_s


# --- a later search: from a capacity the study measured -------------------------------------


@given(
    true_req_per_s=st.floats(0.5, 500.0),
    resolution=st.sampled_from([0.05, 0.1, 0.15, 0.25]),
    place=st.floats(-0.999, 0.999),
    repeat=st.booleans(),
)
@settings(max_examples=400, deadline=None)
def test_a_later_search_reaches_a_capacity_near_its_start_in_three_windows(
    true_req_per_s, resolution, place, repeat
):
    """From the configuration's own capacity or its nearest neighbour's (``start_hint``), a
    capacity within two resolutions of it either way is resolved in 3 windows."""
    step = (1 + resolution) ** 2
    start = true_req_per_s / step**place
    hint = StartHint(start, repeat=repeat)
    settings_ = CapacitySettings([Request(0.0, 8, 2)], 1.0, resolution=resolution, hint=hint)
    assert not settings_.saturates and settings_.start_req_per_s == start
    calls: list[float] = []
    found = search_capacity(
        threshold(true_req_per_s, calls), settings_.start_req_per_s, resolution, 10,
        first_step=settings_.first_step,
    )  # fmt: skip
    assert lands(found, true_req_per_s, resolution), (calls, found.why_stopped)
    assert len(calls) <= 3, calls


@given(
    true_req_per_s=st.floats(0.5, 500.0),
    resolution=st.sampled_from([0.05, 0.1, 0.25]),
    place=st.floats(-3.0, 0.999),
)
@settings(max_examples=300, deadline=None)
def test_a_gated_search_ends_in_one_window_or_resolves_near_the_gate_in_three(
    true_req_per_s, resolution, place
):
    """Gated at the best capacity so far: below it, one window; up to two resolutions above
    it, 3."""
    gate = true_req_per_s / ((1 + resolution) ** 2) ** place
    calls: list[float] = []
    found = search_capacity(
        threshold(true_req_per_s, calls), 1.0, resolution, 10, gate_req_per_s=gate
    )
    if true_req_per_s < gate:
        assert calls == [gate] and found.below_req_per_s == gate
    else:
        assert lands(found, true_req_per_s, resolution) and len(calls) <= 3, calls


def _trial(params: dict, capacity: float, state=TrialState.COMPLETE):
    """A finished trial of a capacity study with searched ``params``, as the study stores it."""
    dists = {
        "max-num-seqs": IntDistribution(1, 1024, log=True),
        "gpu-memory-utilization": FloatDistribution(0.3, 0.95, step=0.05),
    }
    return optuna.trial.create_trial(
        params=params,
        distributions={k: dists[k] for k in params},
        value=None if state != TrialState.COMPLETE else capacity,
        state=state,
        user_attrs={ARGS_ATTR: {"load-format": "dummy", **params}, CAPACITY_ATTR: capacity},
    )


def test_a_trial_starts_from_its_own_capacity_else_its_nearest_neighbours():
    small = {"max-num-seqs": 16, "gpu-memory-utilization": 0.3}
    large = {"max-num-seqs": 512, "gpu-memory-utilization": 0.9}
    trials = [
        _trial({}, 100.0),  # the baseline: vLLM's defaults
        _trial(small, 10.0),
        _trial(small, 14.0),
        _trial(small, 12.0),
        _trial(large, 90.0),
        _trial(large, 0.0),  # met no rate: says nothing of where to start
        _trial({"max-num-seqs": 64, "gpu-memory-utilization": 0.9}, 50.0, TrialState.FAIL),
    ]

    def hint(params):
        return start_hint(trials, {"load-format": "dummy", **params}, params)

    assert hint({}) == StartHint(100.0, repeat=True)
    assert hint(small) == StartHint(12.0, repeat=True)  # the median of its three
    assert hint(large) == StartHint(90.0, repeat=True)
    # Nearest on the log scale of max-num-seqs: 128 is nearer 512 than 16; the failed 64 is no
    # neighbour.
    assert hint({"max-num-seqs": 128, "gpu-memory-utilization": 0.9}) == StartHint(90.0, False)
    assert hint({"max-num-seqs": 24, "gpu-memory-utilization": 0.35}) == StartHint(12.0, False)
    # No measured trial searched just these dimensions (the baseline searched none).
    assert hint({"max-num-seqs": 24}) is None
    assert start_hint(trials[5:], {"load-format": "dummy", **large}, large) is None


# --- the window at a rate ----------------------------------------------------------------


def test_a_window_at_a_rate_keeps_its_shape_and_repeats():
    window = [Request(0.0, 10, 2), Request(0.5, 20, 3), Request(0.6, 30, 4), Request(1.5, 40, 5)]
    # 4 requests over a 2 s period: 2 req/s; at 4 req/s the arrivals are halved.
    sent = at_rate(window, 2.0, 4.0, 3.0)
    assert [r.arrival_s for r in sent[:4]] == [0.0, 0.25, 0.3, 0.75]
    assert [r.arrival_s for r in sent[4:]] == [1.0, 1.25, 1.3, 1.75, 2.0, 2.25, 2.3, 2.75]
    assert [r.input_tokens for r in sent] == [10, 20, 30, 40] * 3
    assert len(sent) / 3.0 == 4.0
    slow = at_rate(window, 2.0, 0.5, 10.0)  # a quarter of the rate: 4x slower
    assert [r.arrival_s for r in slow] == [0.0, 2.0, 2.4, 6.0, 8.0]


def test_a_repeat_of_the_window_shares_only_the_trace_s_history_with_it():
    """A repeat is more traffic like the window's, not its prompts again: its shared blocks get
    ids of their own, but for those the trace sent before the window (found cached by every
    repeat alike); inside a repeat, the window's own sharing stays."""
    window = [Request(0.0, 30, 2, (1, 5, 6)), Request(1.0, 30, 2, (1, 5, 7))]
    sent = at_rate(window, 2.0, 2.0, 2.0, history=frozenset({1}))  # the window twice
    assert [r.hash_ids for r in sent] == [(1, 5, 6), (1, 5, 7), (1, 13, 14), (1, 13, 15)]
    assert [r.hash_ids for r in at_rate(window, 2.0, 1.0, 2.0)] == [(1, 5, 6), (1, 5, 7)]


# --- the lost-SLO rule -------------------------------------------------------------------


def test_a_window_is_lost_only_when_the_percentile_cannot_recover():
    slos = {"ttft_p95_s": 1.0, "e2e_p99_s": 5.0, "tpot_p95_s": 0.1}
    # 100 requests in the window: p95 is past 1 s once 100 - floor(0.95 * 99) = 6 are.
    late = [LiveRequest(sent_s=0.0, sent=True) for _ in range(5)]  # waiting 2 s at now = 2
    fast = [LiveRequest(sent_s=0.0, first_token_s=0.1, done_s=0.5, sent=True) for _ in range(20)]
    assert lost_slos(2.0, late + fast, 100, slos) == []
    # Scheduled at 0 but not sent yet: waiting on tuner's client, not on the server.
    assert lost_slos(2.0, [*late, LiveRequest(sent_s=0.0), *fast], 100, slos) == []
    late.append(LiveRequest(sent_s=0.5, first_token_s=1.6, done_s=2.0, sent=True))
    assert lost_slos(2.0, late + fast, 100, slos) == ["ttft_p95_s"]
    # Then the end-to-end p99: 100 - floor(0.99 * 99) = 3 requests past 5 s, still waiting.
    assert lost_slos(6.0, late + fast, 100, slos) == ["ttft_p95_s", "e2e_p99_s"]


def test_a_tpot_counts_toward_a_lost_window_only_once_its_request_is_done():
    """A TPOT may still fall while its request decodes; once done it is final. Of 40 requests
    that decode, p95 is past 0.1 s once 40 - floor(0.95 * 39) = 3 finished past it."""
    slos = {"tpot_p95_s": 0.1}

    def done(tpot_s: float, tokens: int = 11) -> LiveRequest:
        return LiveRequest(0.0, 0.5, 0.5 + tpot_s * (tokens - 1), True, output_tokens=tokens)

    slow = [done(0.2), done(0.2)]
    decoding = [LiveRequest(0.0, 0.5, None, True, output_tokens=11) for _ in range(30)]
    assert lost_slos(60.0, slow + decoding, 50, slos, decoding=40) == []
    # One token asked for: no TPOT at all, however long it took.
    assert lost_slos(60.0, [*slow, done(5.0, tokens=1)], 50, slos, decoding=40) == []
    assert lost_slos(60.0, [*slow, done(0.11)], 50, slos, decoding=40) == ["tpot_p95_s"]
    # Counted over the 50 judged where the decoding ones are not given: 4 needed.
    assert lost_slos(60.0, [*slow, done(0.11)], 50, slos) == []


# --- against a stand-in server -----------------------------------------------------------


def _chunk(payload: bytes) -> bytes:
    line = b"data: " + payload + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(line), line)


class StandIn:
    """Fast at or below ``CAPACITY_REQ_PER_S`` since the last reset, slow above; with ``slots``,
    a server that runs that many requests at once, each for ``service_s``, the rest waiting:
    it completes ``slots / service_s`` a second at most."""

    def __init__(self, slots: int | None = None, service_s: float = 0.1) -> None:
        self.slots, self.service_s = slots, service_s
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.port = 0
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        self.ready.wait(10)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.arrivals: list[float] = []
        self.running = asyncio.Semaphore(self.slots or 1)
        self.generation = 0
        server = self.loop.run_until_complete(
            asyncio.start_server(self._handle, "127.0.0.1", 0, backlog=1024)
        )
        self.port = server.sockets[0].getsockname()[1]
        self.ready.set()
        self.loop.run_forever()
        server.close()
        pending = asyncio.all_tasks(self.loop)
        for task in pending:
            task.cancel()
        self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        self.loop.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                method, path, _ = head.split(b"\r\n", 1)[0].split(b" ", 2)
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                body = await reader.readexactly(length) if length else b""
                if method == b"POST" and path == b"/v1/completions":
                    tokens = json.loads(body)["max_tokens"]
                    if self.slots is None:
                        await asyncio.sleep(self._delay_s())
                    else:
                        sent_in = self.generation
                        async with self.running:
                            # What waited from before the last reset was abandoned: as vLLM
                            # aborts a request whose client left, it takes no slot's time.
                            if sent_in == self.generation:
                                await asyncio.sleep(self.service_s)
                    out = [b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"]
                    out.append(b"transfer-encoding: chunked\r\n\r\n")
                    for i in range(tokens):
                        out.append(_chunk(b'{"choices":[{"index":0,"text":" t%d"}]}' % i))
                    usage = b'{"choices":[],"usage":{"completion_tokens":%d}}' % tokens
                    out += [_chunk(usage), _chunk(b"[DONE]"), b"0\r\n\r\n"]
                    writer.write(b"".join(out))
                elif path == b"/reset_prefix_cache":
                    self.arrivals = []
                    self.generation += 1
                    writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                elif path == b"/metrics":
                    writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                else:
                    writer.write(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    def _delay_s(self) -> float:
        now = self.loop.time()
        self.arrivals.append(now)
        count = len(self.arrivals)
        if count < JUDGED_FROM or now <= self.arrivals[0]:
            return FAST_S
        rate = (count - 1) / (now - self.arrivals[0])
        return SLOW_S if rate > CAPACITY_REQ_PER_S else FAST_S

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture
def stand_in() -> Iterator[StandIn]:
    server = StandIn()
    try:
        yield server
    finally:
        server.close()


@pytest.mark.vllm
def test_the_search_finds_a_known_capacity(stand_in, caplog):
    # Evenly spaced arrivals from 5 req/s: 5, 10 pass, 20 fails, then bisection. A lagging
    # client bunches a few arrivals, so the boundary measured may sit a little below 10.
    window = [Request(i * 0.2, 8, 2) for i in range(5)]  # 5 req/s
    settings = CapacitySettings(
        window, period_s=1.0, probe_s=4.0, resolution=0.1, max_probes=8, min_requests=0
    )
    replay = ReplaySettings(model="m", vocab_size=1000, request_timeout_s=30, drain_timeout_s=30)
    slos = {"ttft_p95_s": 0.5}
    with caplog.at_level("INFO", logger="tuner.study.capacity.rates"):
        found = measure_capacity(
            stand_in.url, settings, replay, Criteria(slos, {"ttft_p95_s": 1.0})
        )
    rates = [round(p.rate_req_per_s, 2) for p in found.points]
    assert found.resolved, (rates, found.why_stopped)
    # Within the resolution below the boundary, itself at most 5 % below the known rate.
    low = CAPACITY_REQ_PER_S * 0.95 / (1 + settings.resolution)
    assert low <= found.capacity_req_per_s <= CAPACITY_REQ_PER_S * 1.01, rates
    assert len(found.points) <= settings.max_probes
    assert len([r for r in caplog.records if "req/s:" in r.getMessage()]) == len(found.points)
    best = found.best_point
    assert best is not None and best.figures["ttft_p95_s"] <= slos["ttft_p95_s"]
    # Far above the capacity, a window stops within seconds: its SLO is lost for certain.
    stopped = [p for p in found.points if p.figures.get("stopped_at_s") is not None]
    assert all(not p.passed and "lost" in (p.reason or "") for p in stopped)
    assert all(p.figures["prefix_cache_reset"] == 1.0 for p in found.points)


def test_a_gate_above_the_capacity_costs_one_window(stand_in):
    """Gated at twice the stand-in's capacity (the best so far in a study), the search measures
    that rate only, and says the capacity is below it."""
    window = [Request(i * 0.2, 8, 2) for i in range(5)]  # 5 req/s
    gate = 2 * CAPACITY_REQ_PER_S
    settings = CapacitySettings(
        window, period_s=1.0, probe_s=4.0, gate_req_per_s=gate, min_requests=0
    )
    replay = ReplaySettings(model="m", vocab_size=1000, request_timeout_s=30, drain_timeout_s=30)
    found = measure_capacity(stand_in.url, settings, replay, Criteria({"ttft_p95_s": 0.5}, {}))
    assert [p.rate_req_per_s for p in found.points] == [gate]
    assert found.below_req_per_s == gate and found.capacity_req_per_s == 0.0


@pytest.mark.vllm  # a stand-in server's windows, waited out in real time
def test_the_defaults_are_measured_once_more_at_the_finalist_s_capacity(stand_in):
    """vLLM's defaults measured again in the confirm step search their own capacity, then replay
    one window at the finalist's capacity in the search (above theirs), so the result compares
    both at one rate; that window is not one of the search's points. Below their capacity,
    nothing more is measured."""
    window = [Request(i * 0.2, 8, 2) for i in range(5)]  # 5 req/s
    replay = ReplaySettings(model="m", vocab_size=1000, request_timeout_s=30, drain_timeout_s=30)
    slos = {"ttft_p95_s": 0.5}
    leader = 4 * CAPACITY_REQ_PER_S
    settings = CapacitySettings(
        window, period_s=1.0, probe_s=3.0, compare_req_per_s=leader, min_requests=0
    )
    found = measure_capacity(stand_in.url, settings, replay, Criteria(slos, {}))
    assert found.capacity_req_per_s > 0 and found.compared is not None
    assert found.compared.rate_req_per_s == leader and not found.compared.passed
    assert all(p.rate_req_per_s != leader for p in found.points)
    below = dataclasses.replace(settings, compare_req_per_s=found.capacity_req_per_s / 2)
    assert measure_capacity(stand_in.url, below, replay, Criteria(slos, {})).compared is None


@pytest.mark.vllm  # a stand-in server's windows, waited out in real time
def test_one_rate_is_measured_alone_as_the_search_would(stand_in):
    # What a caller that picks its own rates gets (benchmarks/capacity.py's scan): the same
    # point the search would record for that rate, told to ``on_rate`` under its index.
    window = [Request(i * 0.2, 8, 2) for i in range(5)]  # 5 req/s
    settings = CapacitySettings(window, period_s=1.0, probe_s=3.0, min_requests=0)
    replay = ReplaySettings(model="m", vocab_size=1000, request_timeout_s=30, drain_timeout_s=30)
    slos = {"ttft_p95_s": 0.5}
    told: set[tuple[int, float]] = set()

    def on_rate(index, rate, elapsed_s, live):
        told.add((index, rate))

    below = CAPACITY_REQ_PER_S / 2
    point = measure_rate(stand_in.url, settings, replay, Criteria(slos, {}), below, 7, on_rate)
    assert point.passed and point.rate_req_per_s == below, point
    assert point.figures["requests"] == 15 and point.figures["ttft_p95_s"] <= slos["ttft_p95_s"]
    assert told == {(7, below)}
    far_above = CAPACITY_REQ_PER_S * 4
    point = measure_rate(stand_in.url, settings, replay, Criteria(slos, {}), far_above)
    assert not point.passed and "lost" in (point.reason or ""), point
    assert point.figures["stopped_at_s"] < settings.probe_s


@pytest.mark.vllm  # a stand-in server's windows, waited out in real time
def test_a_saturating_window_measures_what_the_server_sustains():
    """Offered 80 req/s, a server that completes 20 a second at most (4 at once, 0.2 s each):
    the window reads about 20 from its second half, fails, and is stopped a quarter of its
    seconds after its last arrival, with the queue abandoned."""
    server = StandIn(slots=4, service_s=0.2)
    try:
        window = [Request(i * 0.2, 8, 2) for i in range(5)]  # 5 req/s
        settings = CapacitySettings(window, period_s=1.0, probe_s=4.0, min_requests=0)
        replay = ReplaySettings(model="m", vocab_size=1000, request_timeout_s=30)
        criteria = Criteria({"ttft_p95_s": 0.5}, {})
        point = measure_saturated(server.url, settings, replay, criteria, 80.0)
    finally:
        server.close()
    assert not point.passed and "saturating window" in (point.reason or ""), point
    assert 16.0 <= point.figures[SUSTAINED] <= 20.5, point.figures
    assert point.figures["requests"] == 320
    assert point.figures["stopped_at_s"] <= 4.0 * 1.25 + 1.0


def filling_engine(
    slots: int, arrivals_per_s: float, prompt: int, output: int, token_s: float, window_s: float
) -> ReplayResult:
    """A replay as a saturating window on an engine that runs ``slots`` requests at once, first
    come first served, each streaming ``output`` tokens ``token_s`` apart from its admission,
    flooded at ``arrivals_per_s`` for ``window_s`` seconds and abandoned a quarter of that
    after: what the client saw of each request."""
    free = [0.0] * slots
    stopped = window_s * 1.25
    live = []
    for i in range(int(arrivals_per_s * window_s)):
        sent = i / arrivals_per_s
        slot = min(range(slots), key=free.__getitem__)
        first = max(sent, free[slot])
        done = first + output * token_s
        free[slot] = done
        request = LiveRequest(sent, sent=True, output_tokens=output, input_tokens=prompt)
        if first <= stopped:
            request.first_token_s = first
            request.tokens = output if done <= stopped else int((stopped - first) / token_s)
            request.done_s = done if done <= stopped else None
        live.append(request)
    return ReplayResult([], stopped, stopped_at_s=stopped, live=live)


def test_a_saturating_window_reads_the_work_done_not_the_requests_completed():
    """An engine that runs 100 requests at once, each streaming 80 tokens over 8 s, sustains
    12.5 req/s. Flooded at 50 req/s, it completes its first 100 in a 10 s window's second half
    (20 a second) and none in a 6 s window's: the requests completed read it 1.6 times too high
    or not at all. Its output tokens streamed read it exactly in both; the prompts admitted in
    the 10 s window's second half read 20, and the larger of the two bounds it from above. The
    engine of a GPU, its batch filling with long prompts, completed 15 requests in a window's
    second half, 3 req/s, where 16.5 met the SLOs."""
    window = [Request(0.0, 20, 80)]
    for window_s, completed, read in ((10.0, 100, 20.0), (6.0, 0, 12.5)):
        result = filling_engine(100, 50.0, 20, 80, 0.1, window_s)
        done = [r.done_s for r in result.live if r.done_s is not None]
        assert sum(window_s / 2 <= d <= window_s for d in done) == completed
        reading = sustained(result, window, (window_s / 2, window_s))
        assert reading is not None
        served, req_per_s = reading
        assert served >= MIN_WINDOW_REQUESTS
        assert req_per_s == pytest.approx(read, rel=0.02), (window_s, req_per_s)


def test_a_saturating_window_that_served_too_few_reads_nothing():
    """One request at a time, 4 s each: 2 served in the window's second half, too few to say."""
    result = filling_engine(1, 10.0, 20, 40, 0.1, 6.0)
    assert sustained(result, [Request(0.0, 20, 40)], (3.0, 6.0)) is None


@pytest.mark.vllm  # a stand-in server's windows, waited out in real time
def test_a_saturating_window_that_completed_too_few_bounds_nothing():
    """One request at a time, half a second each: 2 completed in the window's second half,
    fewer than the floor's requests, so the window gives no throughput to bound by."""
    server = StandIn(slots=1, service_s=0.5)
    try:
        window = [Request(i * 0.2, 8, 2) for i in range(5)]  # 5 req/s
        settings = CapacitySettings(window, period_s=1.0, probe_s=2.0, min_requests=0)
        replay = ReplaySettings(model="m", vocab_size=1000, request_timeout_s=30)
        criteria = Criteria({"ttft_p95_s": 0.5}, {})
        point = measure_saturated(server.url, settings, replay, criteria, 40.0)
    finally:
        server.close()
    assert SUSTAINED not in point.figures and point.figures[COMPLETED] <= 3, point
    assert "requests completed in its second half" in (point.reason or "")


@pytest.mark.vllm  # a stand-in server's windows, waited out in real time
def test_a_first_search_brackets_from_the_saturating_window_on_a_running_server():
    """On a server that completes 20 req/s at most: the search begins with the saturating
    window at 32 times the start, reads the throughput from it, and resolves the capacity
    below it in a few windows more; each later window starts from a reset server."""
    server = StandIn(slots=4, service_s=0.2)
    try:
        gaps = random.Random(7)
        arrivals = itertools.accumulate(gaps.expovariate(2.0) for _ in range(20))
        window = [Request(t, 8, 2) for t in arrivals]  # random arrivals, 2 req/s
        # On a loaded machine tuner's client runs late near this server's limit: its lateness
        # is not to blame here, where the search's course is the subject.
        settings = CapacitySettings(
            window, period_s=10.0, probe_s=3.0, min_requests=0, saturate=True, max_probes=8,
            client_tolerance_s=60.0,
        )  # fmt: skip
        assert settings.saturates
        replay = ReplaySettings(model="m", vocab_size=1000, request_timeout_s=30)
        found = measure_capacity(server.url, settings, replay, Criteria({"ttft_p95_s": 0.5}, {}))
    finally:
        server.close()
    rates = [round(p.rate_req_per_s, 2) for p in found.points]
    assert rates[0] == 64.0 and SUSTAINED in found.points[0].figures, rates
    assert 14.0 <= found.points[0].figures[SUSTAINED] <= 20.5, found.points[0].figures
    assert found.resolved and len(found.points) <= 6, (rates, found.why_stopped)
    assert 10.0 <= found.capacity_req_per_s <= 26.0, rates
    assert all(SUSTAINED not in p.figures for p in found.points[1:])


def test_a_rate_is_judged_on_enough_requests_after_its_lead_in(stand_in):
    """A rate too sparse for ``min_requests`` in its seconds is replayed longer (at most
    ``MAX_SPAN`` times), and the requests of its lead-in are sent but not judged."""
    window = [Request(i * 0.2, 8, 2) for i in range(5)]  # 5 req/s
    settings = CapacitySettings(window, period_s=1.0, probe_s=1.0, min_requests=10)
    assert settings.span_s(5.0) == 2.0 and settings.span_s(10.0) == 1.0
    assert settings.span_s(0.5) == MAX_SPAN  # 20 s wanted; 4 times 1 s at most
    replay = ReplaySettings(model="m", vocab_size=1000, request_timeout_s=30, drain_timeout_s=30)
    point = measure_rate(
        stand_in.url, settings, replay, Criteria({"ttft_p95_s": 0.5}, {}), 5.0, lead_s=0.4
    )
    assert point.passed, point
    # Sent: 0.0, 0.2, ..., 2.2 s (the lead-in and 2 s more); judged: from 0.4 s on.
    assert point.figures["requests_sent"] == 12 and point.figures["requests"] == 10
    assert point.figures["lead_s"] == 0.4


def test_the_lead_in_is_the_last_median_end_to_end_time(monkeypatch):
    """Each rate's lead-in is the median end-to-end time the engine measured last (the hint's
    at its capacity for the first rate), at most the rate's seconds; none with ``steady`` off."""
    leads: list[float] = []
    e2es = iter([0.7, 9.0, 0.2])

    def fake(base_url, settings, replay, criteria, rate, index, on_rate, lead_s):
        leads.append(lead_s)
        return RatePoint(rate, rate < 12, {"e2e_p50_s": next(e2es)})

    monkeypatch.setattr(probes, "measure_rate", fake)
    hint = StartHint(10.0, repeat=True, e2e_s=0.5)
    settings = CapacitySettings(
        [Request(0.0, 8, 2)], period_s=1.0, probe_s=4.0, hint=hint, max_probes=3
    )
    measure_capacity("http://x", settings, ReplaySettings("m", 1000), Criteria({}, {}))
    assert leads == [0.5, 0.7, 4.0]
    assert CapacitySettings([], period_s=1.0, steady=False).lead_s(3.0) == 0.0


def test_a_replay_after_its_lead_in_keeps_the_requests_scheduled_from_it():
    results = [RequestResult(t, t, 8, 2, 0.1, 0.2) for t in (0.0, 0.5, 1.0, 1.5)]
    live = [LiveRequest(t, 0.1 + t, 0.2 + t, True, t) for t in (0.0, 0.5, 1.0, 1.5)]
    kept = after_lead_in(ReplayResult(results, 2.0, live=live), 1.0)
    assert [r.scheduled_s for r in kept.results] == [1.0, 1.5] and kept.duration_s == 2.0
    assert [r.scheduled_s for r in kept.live] == [1.0, 1.5]


# --- a capacity study on vLLM ------------------------------------------------------------


@pytest.mark.vllm
@pytest.mark.xdist_group("cap-load")
def test_a_capacity_study_ranks_configurations_by_the_load_they_carry(
    cap_load: CapLoad, tmp_path: Path
) -> None:
    """vLLM's CPU build, cpu-tiny: max-num-seqs 1 serves one request at a time, vLLM's defaults
    share the decoding of many; the study measures that the defaults carry more, each trial on
    one engine start, confirms on fresh engines and writes the capacity into the YAML header.
    The load, SLOs and windows come from what this machine serves first (``cap_load``): the
    ranking is measured, not the machine's speed."""
    alone, load, peak_req_per_s = cap_load.alone, cap_load.load, cap_load.workload.peak_req_per_s
    spec = (
        cap_load.spec
        | load
        | {
            "model": str(cap_load.model),
            "candidates": [{"max-num-seqs": 1, "gpu-memory-utilization": 0.2}],
            "n_trials": 2,
            "warmup_requests": 2,
            "window_s": CAP_WINDOW_S,
            # A coarse resolution: this checks the ranking, not the last 10 %; each rate judged on
            # its window's requests, not lengthened to 100 (the search's floor, 10, holds).
            "capacity_resolution": 0.5,
            "capacity_min_requests": MIN_WINDOW_REQUESTS,
            "capacity_max_probes": 6,
            # The finalist and the baseline on one fresh engine each (where the searched
            # configuration met the SLOs; else the baseline once more): too few for a verdict, the
            # pipeline runs.
            "confirm_top_k": 1,
            "confirm_repeats": 1,
        }
    )
    spec_file = write_spec(tmp_path / "cap.yaml", spec)
    trace = cap_load.trace
    # Four engine starts at most, each searching six windows at most, each drained.
    budget_s = 4 * (2 * alone.healthy_s + 6 * cap_load.drained_s()) + 120
    done = run_tuner(
        "run", "--trace", trace, "--study", "cap", "--spec", spec_file, cwd=tmp_path,
        timeout_s=budget_s,
    )  # fmt: skip
    said = f"{alone}\n{load}\n{done.stdout}"
    assert done.returncode in (0, 3, 4), said + done.stderr
    study = optuna.load_study(study_name="cap", storage=f"sqlite:///{tmp_path}/studies/cap.db")
    trials = study.get_trials()
    firsts = [t for t in trials if CONFIRMS_ATTR not in t.user_attrs]
    repeats = [t.user_attrs[CONFIRMS_ATTR] for t in trials if CONFIRMS_ATTR in t.user_attrs]
    assert len(firsts) == 2 and 1 <= len(repeats) <= 4, said
    assert 0 in repeats  # the baseline
    by_seqs = {}
    for trial in firsts:
        attrs = trial.user_attrs
        assert trial.value == attrs[CAPACITY_ATTR], attrs
        assert POINTS_ATTR in attrs, attrs.get("reason")
        points = attrs[POINTS_ATTR]
        assert 1 <= len(points) <= 6 and attrs["capacity_windows"] == len(points)
        passed = [p["rate_req_per_s"] for p in points if p["passed"]]
        assert attrs[CAPACITY_ATTR] == max(passed, default=0.0)
        assert all("ttft_p95_s" in p for p in points)
        by_seqs[attrs["engine_args"].get("max-num-seqs")] = attrs[CAPACITY_ATTR]
    ones = by_seqs.pop(1)
    (defaults,) = by_seqs.values()
    assert defaults > ones, (ones, defaults, said)
    for trial in trials:
        original = trials[trial.user_attrs.get(CONFIRMS_ATTR, trial.number)]
        if original is not trial and original.value:
            # A re-measurement's search starts at the capacity its configuration measured.
            start = trial.user_attrs["capacity_start_req_per_s"]
            assert start == pytest.approx(original.value), (trial.number, start, original.value)
    header = (tmp_path / "configs" / "cap.yaml").read_text()
    # Beside the configuration written: vLLM's defaults, or where they are kept, the closest
    # searched configuration that met the SLOs, where one did.
    line = r"^# capacity: [\d.]+ req/s \([\d.]+x the trace's peak rate"
    line += r"(; (defaults|trial \d+) [\d.]+ req/s)?\)$"
    assert re.search(line, header, re.M), header
    assert f"# servers for the peak ({num(peak_req_per_s)} req/s): " in header
    assert "capacity" in done.stdout and "servers for peak" in done.stdout
    assert re.search(r"^# (winner|defaults|baseline) trial \d+: capacity ", header, re.M), header


# --- what tuner run says of a capacity study (scripted outcomes, no server) ---------------


def capacity_outcome(capacity: float, ttft_p95_s: float = 0.5) -> TrialOutcome:
    points = (
        RatePoint(capacity or 1.0, capacity > 0, {"ttft_p95_s": ttft_p95_s}),
        RatePoint(2 * (capacity or 1.0), False, {"ttft_p95_s": 9.0}, "missed slo_ttft_p95_s"),
    )
    metrics = {CAPACITY_ATTR: capacity, "ttft_p95_s": ttft_p95_s, "capacity_windows": 2.0}
    reason = None if capacity else "no rate met the SLOs"
    return TrialOutcome(
        {}, capacity_score(capacity), metrics, {}, reason, points=tuple(p.as_attr() for p in points)
    )


def scripted_capacity_study(
    tmp_path: Path, model: Path, outcomes: list[TrialOutcome], confirmed: int = 0
) -> list[str]:
    """A capacity study of ``outcomes`` through ``run_study``, the last ``confirmed`` of them
    the confirmation's (the finalist and the baseline, 3 fresh each, in ABBA order); the
    ``tuner run`` arguments that report on it."""
    spec_raw = {
        "model": str(model),
        "dummy_model": None,
        "engine_args": {"load-format": "dummy"},
        "search_space": {"max-num-seqs": {"type": "int", "low": 1, "high": 32}},
        "slos": {"ttft_p95_s": 2.0},
        "weights": {"ttft_p95_s": 1.0},
        "window_s": 5,
        "objective_mode": "capacity",
    }
    spec_path = write_spec(tmp_path / "spec.yaml", spec_raw)
    spec = parse_spec(spec_raw)
    trace = tmp_path / "trace.csv"
    write_small_trace(trace)
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    script = iter(outcomes)

    def runner(args, setup, workdir, should_stop=None) -> TrialOutcome:
        return dataclasses.replace(next(script), engine_args=args)

    setup = TrialSetup(
        model=spec.model,
        requests=(),
        replay=ReplaySettings(model="m", vocab_size=100),
        criteria=Criteria(spec.slos, spec.weights),
    )
    study = open_study("cap", storage, 0, objective=CAPACITY_OBJECTIVE)
    run_study(study, spec, setup, tmp_path / "runs", len(outcomes) - confirmed, runner=runner)
    if confirmed:
        confirm(study, Measuring(setup, tmp_path / "runs", runner=runner), 3)
    return [
        "run", "--trace", str(trace), "--study", "cap", "--spec", str(spec_path),
        "--storage", storage, "--n-trials", "0", "--configs", str(tmp_path / "configs"),
    ]  # fmt: skip


def test_the_highest_capacity_is_written_with_its_servers(tmp_path, cpu_model, capsys):
    args = scripted_capacity_study(
        tmp_path,
        cpu_model,
        [
            capacity_outcome(1.5),  # the baseline
            TrialOutcome({}, CAPACITY_FAILED, {CAPACITY_ATTR: 0.0}, {}, "vLLM exited"),
            capacity_outcome(2.5, ttft_p95_s=1.2),
            capacity_outcome(0.0),
            capacity_outcome(2.6, ttft_p95_s=1.1),  # trial 2 on a fresh engine
            dataclasses.replace(  # the baseline, then once at trial 2's capacity in the search
                capacity_outcome(1.6),
                compared={
                    "rate_req_per_s": 2.5,
                    "passed": False,
                    "ttft_p95_s": 4.5,
                    "tpot_p95_s": 0.03,
                    "reason": "missed ttft_p95_s",
                },
            ),
            capacity_outcome(1.5),  # the baseline again
            capacity_outcome(2.5, ttft_p95_s=1.2),  # trial 2
            capacity_outcome(2.7, ttft_p95_s=1.0),  # trial 2
            capacity_outcome(1.7),  # the baseline
        ],
        confirmed=6,
    )
    assert main(args) == EXIT_MEETS_SLOS
    out = capsys.readouterr().out
    header = (tmp_path / "configs" / "cap.yaml").read_text()
    assert "# meets SLOs: yes" in header
    # The window is the trace's busiest 5 s: 20 requests, 4 req/s. The medians of the fresh
    # measurements: 2.6 (trial 2) and 1.6 (the baseline); the search's own do not count.
    assert "# capacity: 2.6 req/s (0.65x the trace's peak rate; defaults 1.6 req/s)" in header
    assert "# servers for the peak (4 req/s): 2 like trial 4 (ceil(4 / 2.6)" in header
    assert (
        "# Measured each at its own capacity (this configuration at 2.6 req/s, defaults at "
        "1.6 req/s), each the median measurement's:"
    ) in header
    # The interval: from the least ratio of a fresh pair (2.5 / 1.7, the rank test's own bound)
    # to the greatest (2.7 / 1.5) widened by the search's 10% resolution.
    assert (
        "# beats vLLM's defaults on fresh engines: 62% better by the median (1.62x, 90% "
        "interval 1.47 to 1.98x; 3 fresh engines each, every pair in its favour, p = 0.05)"
    ) in header
    assert (
        "# at 2.5 req/s, the finalist's capacity in the search, vLLM's defaults: p95 TTFT "
        "4500 ms, p95 TPOT 30 ms: they miss the SLOs (missed ttft_p95_s)"
    ) in header
    assert "p95 TTFT" in header and "1100.0 ms" in header
    assert re.search(r"capacity\s+2\.6 req/s\s+1\.6 req/s", out)
    assert re.search(r"servers for peak\s+2\s+3", out)
    assert "trial   2" not in out  # no trials ran: the report only


def test_a_search_whose_client_fell_behind_at_its_only_rate_is_not_a_capacity_of_0(tmp_path):
    # A re-measurement that failed its first rate with tuner's client behind measured nothing of
    # the server: flagged, so that its 0 stays out of the configuration's median (an H100 study
    # of the conversation trace put the defaults' median at half their capacity so).
    def behind(rate: float) -> RatePoint:
        return RatePoint(rate, False, {"ttft_p95_s": 0.1}, "missed tpot", "client 60 ms late")

    found = search_capacity(behind, 24.6, 0.1)
    assert found.capacity_req_per_s == 0.0 and found.client_behind_at == 24.6
    ended = Ended(timings={}, crashed=False, log_tail="", compiled={}, late={})
    search = RateSearch(CapacitySettings([Request(0.0, 8, 2)], period_s=1.0))
    outcome = search.outcome({}, None, found, ended)
    assert outcome.metrics[CLIENT_BEHIND] == 1.0 and not outcome.feasible
    # One that passed a rate first keeps it: the capacity is at least that.
    calls = iter([True, False])

    def passed_then_behind(rate: float) -> RatePoint:
        return RatePoint(rate, next(calls), {}, None, "client 60 ms late")

    found = search_capacity(passed_then_behind, 10.0, 0.1)
    assert found.capacity_req_per_s == 10.0 and found.client_behind_at is not None
    outcome = search.outcome({}, None, found, ended)
    assert CLIENT_BEHIND not in outcome.metrics and outcome.feasible


def test_no_rate_met_anywhere_writes_the_closest_and_exits_3(tmp_path, cpu_model, capsys):
    args = scripted_capacity_study(
        tmp_path, cpu_model, [capacity_outcome(0.0), capacity_outcome(0.0)]
    )
    assert main(args) == EXIT_MISSES_SLOS
    out = capsys.readouterr().out
    header = (tmp_path / "configs" / "cap.yaml").read_text()
    assert "# meets SLOs: no" in header and "no rate tried met every SLO" in header
    assert "# capacity: 0 req/s" in header
    assert "n/a, trial 0 met no rate" in header
    assert "relax the SLOs" in out


def test_only_failed_engines_write_nothing(tmp_path, cpu_model, capsys):
    failed = TrialOutcome({}, CAPACITY_FAILED, {CAPACITY_ATTR: 0.0}, {}, "vLLM exited")
    args = scripted_capacity_study(tmp_path, cpu_model, [failed, failed])
    assert main(args) == EXIT_FAILED
    assert not (tmp_path / "configs" / "cap.yaml").exists()


def test_each_trial_starts_its_search_from_what_the_study_measured(tmp_path):
    """The baseline starts from the window's rate; a searched trial from its gate, one
    resolution step above the best capacity so far, with the small first step; a
    re-measurement (as the confirm step queues it) from its own capacity, with the small first
    step, and no gate."""
    spec = parse_spec(
        {
            "model": "m",
            "dummy_model": None,
            "search_space": {"max-num-seqs": {"type": "int", "low": 1, "high": 32}},
            "slos": {"ttft_p95_s": 2.0},
            "weights": {"ttft_p95_s": 1.0},
            "objective_mode": "capacity",
        }
    )
    started: list[tuple[float, float]] = []
    capacities = iter([5.0, 8.0, 3.0, 7.0, 7.5])

    gates: list[float | None] = []

    def runner(args, setup, workdir, should_stop=None) -> TrialOutcome:
        started.append((setup.measure.settings.start_req_per_s, setup.measure.settings.first_step))
        gates.append(setup.measure.settings.gate_req_per_s)
        return dataclasses.replace(capacity_outcome(next(capacities)), engine_args=args)

    window = [Request(i * 0.5, 10, 10) for i in range(8)]  # 2 req/s
    setup = TrialSetup(
        model=spec.model,
        requests=(),
        replay=ReplaySettings(model="m", vocab_size=100),
        criteria=Criteria(spec.slos, spec.weights),
        measure=RateSearch(CapacitySettings(requests=window, period_s=4.0, resolution=0.1)),
    )
    study = open_study("cap", f"sqlite:///{tmp_path / 'study.db'}", 0, objective=CAPACITY_OBJECTIVE)
    run_study(study, spec, setup, tmp_path / "runs", 3, runner=runner)
    small = hinted_step(0.1)
    assert started == [(2.0, 2.0), (pytest.approx(5.5), small), (pytest.approx(8.8), small)]
    assert gates == [None, pytest.approx(5.5), pytest.approx(8.8)]
    study.enqueue_trial(dict(study.trials[1].params), user_attrs={CONFIRMS_ATTR: 1})
    run_study(study, spec, setup, tmp_path / "runs", 1, runner=runner)
    assert started[3] == (8.0, small) and gates[3] is None
    # Re-measured at 7.0, trial 1's median is 7.5: the next searched trial is gated a step
    # above that, not above its luckier first measurement.
    run_study(study, spec, setup, tmp_path / "runs", 1, runner=runner)
    assert gates[4] == pytest.approx(7.5 * 1.1)


@pytest.mark.parametrize("true_req_per_s", [4.0, 12.0])
def test_a_gated_search_stops_where_it_cannot_win(true_req_per_s):
    """Gated at 10 req/s (the best so far): a configuration that fails there is measured once,
    its capacity below 10; one that passes is resolved upward from there in small steps."""
    calls: list[float] = []
    found = search_capacity(threshold(true_req_per_s, calls), 3.0, 0.1, 10, gate_req_per_s=10.0)
    if true_req_per_s < 10.0:
        assert calls == [10.0]
        assert found.below_req_per_s == 10.0 and found.capacity_req_per_s == 0.0
        assert "the best capacity so far" in found.why_stopped
    else:
        assert calls[0] == 10.0 and calls[1] == pytest.approx(10.0 * hinted_step(0.1))
        assert found.resolved and found.below_req_per_s is None
        assert found.capacity_req_per_s <= 12.0 < found.capacity_req_per_s * 1.1
        assert len(calls) <= 4


def test_a_latency_study_is_not_resumed_as_a_capacity_one(tmp_path):
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    open_study("s", storage, 0)
    with pytest.raises(InputError, match="is a latency study"):
        open_study("s", storage, 0, objective=CAPACITY_OBJECTIVE)
    open_study("c", storage, 0, objective=CAPACITY_OBJECTIVE)
    with pytest.raises(InputError, match="is a capacity study"):
        open_study("c", storage, 0)


def test_the_baseline_at_one_rate_says_where_its_windows_there_disagree():
    """The line shows the baseline's last window at the finalist's capacity, and where its other
    fresh engines' windows at that rate went the other way, how many and which: the header's
    figures then agree with a verdict that kept the baseline because one of them met the SLOs."""

    def trial(number: int, passed: bool | None) -> optuna.trial.FrozenTrial:
        attrs = {}
        if passed is not None:
            point = {"rate_req_per_s": 24.8, "passed": passed, "ttft_p95_s": 0.765}
            attrs[record.COMPARED_ATTR] = point if passed else {**point, "reason": "stopped"}
        made = optuna.trial.create_trial(value=22.6, user_attrs=attrs)
        made.number = number
        return made

    mixed = [trial(0, None), trial(4, False), trial(5, True), trial(8, False)]
    (line,) = words_of(CAPACITY_OBJECTIVE).at_one_rate(mixed)
    assert line.startswith("at 24.8 req/s, the finalist's capacity in the search, vLLM's defaults")
    assert line.endswith(
        "they miss the SLOs (stopped); of 3 windows there, 1 met them (trial 5), "
        "2 missed (trials 4, 8)"
    )
    (alike,) = words_of(CAPACITY_OBJECTIVE).at_one_rate([trial(4, False), trial(8, False)])
    assert alike.endswith("they miss the SLOs (stopped)")
    assert words_of(CAPACITY_OBJECTIVE).at_one_rate([trial(0, None)]) == []
