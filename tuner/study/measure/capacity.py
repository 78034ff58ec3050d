"""A trial's capacity: the highest arrival rate of the trace's window that one running server
carries within every SLO, with no more requests failing than the spec's ``max_error_rate`` allows.

``measure_capacity`` runs on a server that is already up (started once per trial by
``tuner.study.measure.trial``): for each rate the search asks for
(``tuner.study.measure.rates``), it waits for the server to be idle, primes vLLM's prefix cache
with the shared blocks the trace sent before the window (``tuner.load.priming``: what a server
that had served the trace would hold), and replays the window time-scaled to that rate for
``CapacitySettings.rate_window_s`` seconds. Each window draws its prompts from its own seed, so
no window reuses another's prompts from the prefix cache; only the primed blocks, drawn from the
study's seed, are the same in every window, so a later window's priming finds most of them in
the cache already (on Mooncake's trace, about 2 million tokens to prefill for every window
otherwise). Without blocks to prime, the cache is reset before each window where the server
allows it.
``measure_rate`` is one such rate alone, for a caller that picks its own rates (a brute-force
scan, as ``benchmarks/capacity.py`` does to check the search). Where a trial's search starts,
from a capacity the study already measured for the same configuration or its nearest neighbour
rather than the window's rate, is ``tuner.study.measure.rate_search.start_hint``'s.

A rate is stopped early once its SLOs are lost for certain: more of the window's requests
have already waited past a TTFT or end-to-end SLO (a request still waiting counting with its
wait so far, which only grows) than the percentile lets through.
"""

from __future__ import annotations

import itertools
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

import httpx

from tuner.load.health import CLIENT_TOLERANCE_S
from tuner.load.http import ReplaySettings
from tuner.load.metrics import LiveRequest, parse_scrape
from tuner.load.priming import Primed, prime
from tuner.load.spread import replay
from tuner.study.measure.judge import Criteria, judge
from tuner.study.measure.rates import GROWTH, CapacityFound, RatePoint, hinted_step, search_capacity
from tuner.study.measure.scoring import Score
from tuner.study.plan.spec import CAPACITY_WINDOW_S
from tuner.traces.model import Request
from tuner.traces.workload import at_rate

logger = logging.getLogger(__name__)

# Fewer requests than this in a rate's window say too little of a p95: the search's floor.
MIN_WINDOW_REQUESTS = 10
# How long to wait for the server to finish what the last window left (requests a stopped
# window abandoned are aborted by vLLM when tuner's client disconnects).
IDLE_TIMEOUT_S = 120.0
IDLE_POLL_S = 0.5
# How often a window checks whether its SLOs are lost.
LOST_CHECK_S = 1.0
# Seeds of successive windows: far apart from the study's seed and from each other.
SEED_STRIDE = 7919

# The constraint a capacity trial misses when no rate it tried met the SLOs.
NO_RATE = "no_rate_met_slos"


@dataclass(frozen=True)
class StartHint:
    """A capacity measured earlier in the study, where a trial's search starts: the same
    configuration's (``repeat``: a re-measurement) or its nearest neighbour's."""

    req_per_s: float
    repeat: bool


@dataclass(frozen=True)
class CapacitySettings:
    """How a capacity trial searches: the window's requests and the seconds they span as
    replayed (``period_s``), the seconds each rate is replayed for (``rate_window_s``; the
    spec's ``capacity_window_s``, not its trace window), the relative resolution, and the most
    rates one trial measures (``max_rates``; the spec's ``capacity_max_windows``)."""

    requests: Sequence[Request]
    period_s: float
    rate_window_s: float = CAPACITY_WINDOW_S
    resolution: float = 0.1
    max_rates: int = 10
    client_tolerance_s: float = CLIENT_TOLERANCE_S
    # A capacity already measured in the study (``rate_search.start_hint``): where the search starts
    # instead of the window's rate.
    hint: StartHint | None = None
    # The best capacity in the study so far, for a searched configuration: measured first, and
    # a failure there ends the trial (``search_capacity``'s gate).
    gate_req_per_s: float | None = None
    # For vLLM's defaults measured again in the confirm step: the leading configuration's
    # median capacity, where it is above theirs, measured for one window after the search, so
    # that the result compares both at one rate.
    compare_req_per_s: float | None = None

    @property
    def window_req_per_s(self) -> float:
        """The trace window's own rate, as the spec replays it."""
        return len(self.requests) / self.period_s

    @property
    def start_req_per_s(self) -> float:
        """Where the search starts: the gate, else the hint, else the window's rate."""
        if self.gate_req_per_s is not None:
            return self.gate_req_per_s
        return self.hint.req_per_s if self.hint is not None else self.window_req_per_s

    @property
    def first_step(self) -> float:
        """The bracket's first step: small from the configuration's own capacity (measured again
        it differs by 10 to 20 %) or from the gate (a pass there is to be resolved near it), a
        doubling from a neighbour's or the window's rate."""
        near = self.gate_req_per_s is not None or (self.hint is not None and self.hint.repeat)
        return hinted_step(self.resolution) if near else GROWTH

    @property
    def floor_req_per_s(self) -> float:
        return MIN_WINDOW_REQUESTS / self.rate_window_s


# Told the phase text and the replay's progress: (rate index, rate, elapsed s, live requests).
OnRate = Callable[[int, float, float, Sequence[LiveRequest]], None]


def capacity_score(capacity_req_per_s: float) -> Score:
    """A capacity trial's value for the study (maximized) and its one constraint: some rate met
    every SLO."""
    return Score(capacity_req_per_s, {NO_RATE: 0.0 if capacity_req_per_s > 0 else 1.0})


# A capacity trial whose engine failed: no capacity, and infeasible.
CAPACITY_FAILED = Score(0.0, {"failed": 1.0, NO_RATE: 1.0})


def lost_slos(
    now_s: float, live: Sequence[LiveRequest], total: int, slos: Mapping[str, float]
) -> list[str]:
    """The TTFT and end-to-end SLOs that the window can no longer meet, whatever comes next.

    ``metric_pQ_s`` over ``total`` requests is above its limit once the requests already past
    it (lower bounds: a request still waiting counts with its wait so far) reach
    ``total - floor(Q/100 * (total - 1))``: then the value at the percentile's lower rank is
    past the limit, and with it the interpolated percentile. Only requests already sent count:
    one still waiting for tuner's own client to send it is waiting on tuner, not the server,
    and its figures will count from when it is sent (on a 2-core machine with vLLM on both
    cores, the client ran up to 2.4 s late, and a window passing at 742 ms TTFT p95 was
    stopped as lost when the scheduled times counted).
    """
    lost = []
    for metric, limit in slos.items():
        prefix, _, rest = metric.partition("_p")
        if prefix not in ("ttft", "e2e") or not rest.endswith("_s"):
            continue
        quantile = float(rest.removesuffix("_s"))
        needed = total - math.floor(quantile / 100 * (total - 1))
        over = 0
        for r in live:
            if not r.sent:
                continue
            end_s = r.first_token_s if prefix == "ttft" else r.done_s
            if (now_s if end_s is None else end_s) - r.sent_s > limit:
                over += 1
        if over >= needed:
            lost.append(metric)
    return lost


def wait_idle(base_url: str, timeout_s: float = IDLE_TIMEOUT_S) -> bool:
    """Wait until vLLM has nothing running or waiting (its ``/metrics`` gauges); False if it
    still has after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    with httpx.Client(base_url=base_url, timeout=10.0) as client:
        while True:
            try:
                gauges = parse_scrape(client.get("/metrics").text).values
            except httpx.HTTPError:
                gauges = {}
            busy = gauges.get("vllm:num_requests_running", 0.0) + gauges.get(
                "vllm:num_requests_waiting", 0.0
            )
            if busy == 0:
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(IDLE_POLL_S)


def reset_prefix_cache(base_url: str) -> bool:
    """Ask vLLM to drop its prefix cache; False where the server does not offer it (vLLM serves
    ``/reset_prefix_cache`` only with ``VLLM_SERVER_DEV_MODE=1``)."""
    try:
        response = httpx.post(f"{base_url}/reset_prefix_cache", timeout=30.0)
    except httpx.HTTPError:
        return False
    return response.status_code == 200


def measure_rate(
    base_url: str,
    settings: CapacitySettings,
    replay_settings: ReplaySettings,
    criteria: Criteria,
    rate: float,
    index: int = 0,
    on_rate: OnRate | None = None,
) -> RatePoint:
    """Replay the window at ``rate`` for ``settings.rate_window_s`` on the running server, and judge
    it by ``criteria``: passed if every SLO is met and no more requests failed than its
    ``max_error_rate`` lets through.

    ``index`` is the window's place in its search: it numbers the window for ``on_rate`` and
    picks the seed of its prompts. The server is first waited on until idle, then its prefix
    cache primed with the blocks the trace sent before the window (``tuner.load.priming``), or,
    with none to prime, reset where the server allows; the window stops early once its SLOs are
    lost for certain.
    """
    idle = wait_idle(base_url)
    # A primed cache is kept: of this window's blocks, the next one finds only the trace's
    # history (the rest come from this window's seed), which its priming would send again.
    reset = not replay_settings.cached_ids and reset_prefix_cache(base_url)
    window = at_rate(
        settings.requests,
        settings.period_s,
        rate,
        settings.rate_window_s,
        replay_settings.cached_ids,
    )
    seeded = replace(replay_settings, seed=replay_settings.seed + SEED_STRIDE * (index + 1))
    primed = prime(base_url, window, seeded)
    lost: list[str] = []
    checked_s = 0.0

    def monitor(elapsed_s: float, live: Sequence[LiveRequest]) -> bool:
        nonlocal checked_s
        if on_rate is not None:
            on_rate(index, rate, elapsed_s, live)
        if elapsed_s - checked_s < LOST_CHECK_S:
            return False
        checked_s = elapsed_s
        lost.extend(lost_slos(elapsed_s, live, len(window), criteria.slos))
        return bool(lost)

    result = replay(base_url, window, seeded, monitor=monitor)
    judged = judge(result, criteria, settings.client_tolerance_s)
    reason: str | None
    if judged.stopped_at_s is not None:
        reason = f"stopped {judged.stopped_at_s:.0f} s in: {', '.join(lost)} lost"
    else:
        missed = judged.score.violations
        reasons = [f"missed {', '.join(missed)}"] if missed else []
        if judged.errors:
            reasons.append(f"{len(judged.errors)} requests failed")
        reason = "; ".join(reasons) or None
    point_figures = _point_figures(judged.figures, len(window), idle, reset, primed)
    return RatePoint(rate, judged.passed, point_figures, reason, judged.client_to_blame)


def measure_capacity(
    base_url: str,
    settings: CapacitySettings,
    replay_settings: ReplaySettings,
    criteria: Criteria,
    on_rate: OnRate | None = None,
) -> CapacityFound:
    """Search the capacity of the server at ``base_url`` (already healthy, warmed up), each
    rate judged by ``criteria`` (the spec's SLOs, weights and ``max_error_rate``)."""
    windows = itertools.count()

    def measure(rate: float) -> RatePoint:
        index = next(windows)
        return measure_rate(base_url, settings, replay_settings, criteria, rate, index, on_rate)

    found = search_capacity(
        measure,
        settings.start_req_per_s,
        settings.resolution,
        settings.max_rates,
        settings.floor_req_per_s,
        first_step=settings.first_step,
        gate_req_per_s=settings.gate_req_per_s,
    )
    compare = settings.compare_req_per_s
    if compare is None or compare <= found.capacity_req_per_s or not found.points:
        return found
    return replace(found, compared=measure(compare))


def _point_figures(
    figures: Mapping[str, float], requests: int, idle: bool, reset: bool, primed: Primed
) -> dict[str, float]:
    out = dict(figures)
    out["requests"] = requests
    out["started_idle"] = float(idle)
    out["prefix_cache_reset"] = float(reset)
    out.update(primed.figures())
    return out
