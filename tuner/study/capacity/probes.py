"""A trial's capacity: the highest arrival rate of the trace's window that one running server
carries within every SLO, with no more requests failing than the spec's ``max_error_rate`` allows.

``measure_capacity`` runs on a server that is already up (started once per trial by
``tuner.study.measure.trial``): for each rate the search asks for
(``tuner.study.capacity.rates``), it waits for the server to be idle, primes vLLM's prefix cache
with the shared blocks the trace sent before the window (``tuner.load.priming``: what a server
that had served the trace would hold), and replays the window time-scaled to that rate for
``CapacitySettings.probe_s`` seconds. Each window draws its prompts from its own seed, so
no window reuses another's prompts from the prefix cache; only the primed blocks, drawn from the
study's seed, are the same in every window, so a later window's priming finds most of them in
the cache already (on Mooncake's trace, about 2 million tokens to prefill for every window
otherwise). Without blocks to prime, the cache is reset before each window where the server
allows it.
``measure_rate`` is one such rate alone, for a caller that picks its own rates (a brute-force
scan, as ``benchmarks/capacity.py`` does to check the search). Where a trial's search starts,
from a capacity the study already measured for the same configuration or its nearest neighbour
rather than the window's rate, is ``tuner.study.capacity.rate_search.start_hint``'s.

A rate is stopped early once its SLOs are lost for certain: more of the window's requests
have already waited past a TTFT or end-to-end SLO (a request still waiting counting with its
wait so far, which only grows), or finished past a TPOT SLO, than the percentile lets through.
"""

from __future__ import annotations

import itertools
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import httpx

from tuner.load.health import CLIENT_TOLERANCE_S
from tuner.load.http import ReplaySettings
from tuner.load.metrics import LiveRequest, ReplayResult, parse_scrape, summarize_client
from tuner.load.priming import prime
from tuner.load.spread import replay
from tuner.study.capacity.lost import lost_goodput, lost_slos
from tuner.study.capacity.rates import (
    COMPLETED,
    GROWTH,
    SERVED,
    SUSTAINED,
    CapacityFound,
    RatePoint,
    hinted_step,
    search_capacity,
)
from tuner.study.measure.judge import (
    GOODPUT_SHARE,
    SHARE_MET,
    Criteria,
    Judged,
    judge,
    judge_goodput,
)
from tuner.study.measure.scoring import Score
from tuner.study.plan.spec import CAPACITY_MIN_REQUESTS, CAPACITY_PROBE_S
from tuner.traces.model import Request
from tuner.traces.workload import at_rate

logger = logging.getLogger(__name__)

# Fewer requests than this in a rate's window say too little of a p95: the search's floor.
MIN_WINDOW_REQUESTS = 10
# A rate's window too short to hold the spec's ``capacity_min_requests`` at its rate is
# lengthened, up to this many times its seconds.
MAX_SPAN = 4.0
# How long to wait for the server to finish what the last window left (requests a stopped
# window abandoned are aborted by vLLM when tuner's client disconnects).
IDLE_TIMEOUT_S = 120.0
IDLE_POLL_S = 0.5
# How long after its last arrival a saturating window waits for what is left, as a share of its
# seconds.
SATURATED_GRACE = 0.25
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
    # The median end-to-end time measured at that capacity, where recorded: the first rate's
    # lead-in (``CapacitySettings.lead_s``).
    e2e_s: float | None = None


@dataclass(frozen=True)
class CapacitySettings:
    """How a capacity trial searches: the window's requests and the seconds they span as
    replayed (``period_s``), the seconds each rate is replayed for (``probe_s``; the
    spec's ``capacity_probe_s``, not its trace window), the relative resolution, and the most
    rates one trial measures (``max_probes``; the spec's ``capacity_max_probes``)."""

    requests: Sequence[Request]
    period_s: float
    probe_s: float = CAPACITY_PROBE_S
    resolution: float = 0.1
    max_probes: int = 10
    client_tolerance_s: float = CLIENT_TOLERANCE_S
    # A capacity already measured in the study (``rate_search.start_hint``): where the search starts
    # instead of the window's rate.
    hint: StartHint | None = None
    # For a searched configuration, one resolution step above the best capacity in the study so
    # far: measured first, and a failure there ends the trial (``search_capacity``'s gate).
    gate_req_per_s: float | None = None
    # For vLLM's defaults measured again in the confirm step: the leading configuration's
    # median capacity, where it is above theirs, measured for one window after the search, so
    # that the result compares both at one rate.
    compare_req_per_s: float | None = None
    # The fewest requests a rate is judged on (``span_s``), and whether each rate begins with a
    # lead-in that is sent but not judged (``lead_s``): the server's load builds up over about
    # a request's end-to-end time, and a request sent into a half-empty server says little of
    # the load the rate puts on it.
    min_requests: int = CAPACITY_MIN_REQUESTS
    steady: bool = True
    # Where set (a goodput study's ``goodput_share``), a rate passes where at least this share
    # of its requests met every SLO on their own figures (``judge_goodput``), not the
    # percentiles.
    goodput_share: float | None = None
    # Whether a search with no capacity measured to start from (no hint, no gate) begins with
    # a saturating window (``measure_saturated``), whose throughput bounds the capacity.
    saturate: bool = False

    def judged(self, result: ReplayResult, criteria: Criteria) -> Judged:
        """A rate's replay judged: by its percentiles, or by ``goodput_share``."""
        if self.goodput_share is None:
            return judge(result, criteria, self.client_tolerance_s)
        return judge_goodput(result, criteria, self.goodput_share, self.client_tolerance_s)

    def lost(
        self,
        now_s: float,
        live: Sequence[LiveRequest],
        total: int,
        criteria: Criteria,
        decoding: int,
    ) -> list[str]:
        """What the window can no longer meet (``lost_slos``, or ``lost_goodput``)."""
        if self.goodput_share is None:
            return lost_slos(now_s, live, total, criteria.slos, decoding)
        return lost_goodput(now_s, live, total, criteria.slos, self.goodput_share)

    @property
    def marks(self) -> dict[str, float]:
        """What a trial records of how its rates were judged: the goodput share, if any."""
        return {} if self.goodput_share is None else {GOODPUT_SHARE: self.goodput_share}

    def span_s(self, rate_req_per_s: float) -> float:
        """How long a rate's judged requests arrive over: ``probe_s``, or long enough for
        ``min_requests`` at that rate, at most ``MAX_SPAN`` times ``probe_s``."""
        wanted_s = self.min_requests / rate_req_per_s
        return min(max(self.probe_s, wanted_s), MAX_SPAN * self.probe_s)

    def lead_s(self, e2e_s: float | None) -> float:
        """A rate's lead-in: the median end-to-end time measured last on this engine, else at
        the hint's capacity (``StartHint.e2e_s``), at most ``probe_s``; none where
        nothing has been measured yet or ``steady`` is off."""
        if not self.steady or e2e_s is None or not math.isfinite(e2e_s):
            return 0.0
        return min(max(e2e_s, 0.0), self.probe_s)

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
        """The bracket's first step: small from a capacity measured in the study (the
        configuration's own, measured again it differs by 10 to 20 %; its nearest neighbour's;
        the gate, where a pass is to be resolved near it), a doubling from the window's rate."""
        near = self.gate_req_per_s is not None or self.hint is not None
        return hinted_step(self.resolution) if near else GROWTH

    @property
    def saturates(self) -> bool:
        """Whether the search begins with a saturating window: where ``saturate`` asks for one
        and the search has no capacity measured to start from."""
        return self.saturate and self.hint is None and self.gate_req_per_s is None

    @property
    def floor_req_per_s(self) -> float:
        return MIN_WINDOW_REQUESTS / self.probe_s


# Told the phase text and the replay's progress: (rate index, rate, elapsed s, live requests).
OnRate = Callable[[int, float, float, Sequence[LiveRequest]], None]


def capacity_score(capacity_req_per_s: float) -> Score:
    """A capacity trial's value for the study (maximized) and its one constraint: some rate met
    every SLO."""
    return Score(capacity_req_per_s, {NO_RATE: 0.0 if capacity_req_per_s > 0 else 1.0})


# A capacity trial whose engine failed: no capacity, and infeasible.
CAPACITY_FAILED = Score(0.0, {"failed": 1.0, NO_RATE: 1.0})


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
    lead_s: float = 0.0,
) -> RatePoint:
    """Replay the window at ``rate`` on the running server for ``lead_s`` seconds and then
    ``settings.span_s(rate)`` more, and judge the requests sent after the lead-in by
    ``criteria``: passed if every SLO is met and no more requests failed than its
    ``max_error_rate`` lets through.

    ``index`` is the window's place in its search: it numbers the window for ``on_rate`` and
    picks the seed of its prompts. The server is first waited on until idle, then its prefix
    cache primed with the blocks the trace sent before the window (``tuner.load.priming``), or,
    with none to prime, reset where the server allows; the window stops early once its SLOs are
    lost for certain.
    """
    window, seeded, ready = _ready(base_url, settings, replay_settings, rate, index, lead_s)
    to_judge = [r for r in window if r.arrival_s >= lead_s]
    if not to_judge:  # a lead-in longer than the window's arrivals: judge them all
        lead_s, to_judge = 0.0, list(window)
    judged_total = len(to_judge)
    decoding = sum(1 for r in to_judge if r.output_tokens >= 2)
    lost: list[str] = []
    checked_s = 0.0

    def monitor(elapsed_s: float, live: Sequence[LiveRequest]) -> bool:
        nonlocal checked_s
        if on_rate is not None:
            on_rate(index, rate, elapsed_s, live)
        if elapsed_s - checked_s < LOST_CHECK_S:
            return False
        checked_s = elapsed_s
        after_lead = [r for r in live if r.scheduled_s >= lead_s]
        lost.extend(settings.lost(elapsed_s, after_lead, judged_total, criteria, decoding))
        return bool(lost)

    result = replay(base_url, window, seeded, monitor=monitor)
    judged = settings.judged(after_lead_in(result, lead_s), criteria)
    point_figures = {**judged.figures, "requests": judged_total, **ready}
    point_figures |= _sent_figures(result, lead_s)
    reason = _why_failed(judged, lost)
    return RatePoint(rate, judged.passed, point_figures, reason, judged.client_to_blame)


def measure_saturated(
    base_url: str,
    settings: CapacitySettings,
    replay_settings: ReplaySettings,
    criteria: Criteria,
    rate: float,
    index: int = 0,
    on_rate: OnRate | None = None,
) -> RatePoint:
    """Offer the window at ``rate``, far above what the server carries, for
    ``settings.probe_s`` seconds, and measure what it sustains at most (``SUSTAINED``): the
    requests a second its prompts prefilled or its output tokens streamed in the window's
    second half amount to, the larger (``sustained``), where at least ``MIN_WINDOW_REQUESTS``
    requests were served there (``SERVED``). ``COMPLETED``: how many requests completed
    there. The window is not stopped when its SLOs are lost, but a quarter of
    ``probe_s`` after its last arrival, abandoning what is left; one that finished everything
    by then is judged as any rate is. Prepared as ``measure_rate`` prepares a rate (idle,
    primed or reset)."""
    span_s = settings.probe_s
    window, seeded, ready = _ready(base_url, settings, replay_settings, rate, index, 0.0, span_s)

    def monitor(elapsed_s: float, live: Sequence[LiveRequest]) -> bool:
        if on_rate is not None:
            on_rate(index, rate, elapsed_s, live)
        return elapsed_s >= span_s * (1.0 + SATURATED_GRACE)

    result = replay(base_url, window, seeded, monitor=monitor)
    judged = settings.judged(result, criteria)
    half = (span_s / 2, span_s)
    done = [r.sent_s + r.e2e_s for r in result.results if r.ok and r.e2e_s is not None]
    completed = sum(1 for d in done if half[0] <= d <= half[1])
    figures = {**judged.figures, "requests": len(window), **ready, COMPLETED: float(completed)}
    reading = sustained(result, window, half)
    said = f"{completed} requests completed in its second half"
    if reading is not None:
        served, figures[SUSTAINED] = reading
        figures[SERVED] = float(served)
        said = (
            f"{figures[SUSTAINED]:.3g} req/s of work in its second half "
            f"({completed} requests completed there)"
        )
    reason = None if judged.passed else f"saturating window: {said}"
    return RatePoint(rate, judged.passed, figures, reason, judged.client_to_blame)


def sustained(
    result: ReplayResult, window: Sequence[Request], half: tuple[float, float]
) -> tuple[int, float] | None:
    """What a saturating window's ``half`` (seconds from its start) says the server sustains at
    most: how many requests it served then (streaming, or given their first token), and the
    requests a second its work then amounts to, the larger of two readings: the prompt tokens
    it prefilled (a request's, where its first token came in ``half``) over a prompt's mean
    tokens in ``window``, and the output tokens it streamed (each request's spread evenly from
    its first token to its last, or to the replay's end where it was abandoned still streaming)
    over an output's.

    Why the larger bounds what it sustains: an engine busy throughout ``half`` that takes ``u``
    seconds a request to prefill and ``v`` to decode at its fullest, prefilling ``a`` requests'
    prompts a second and decoding ``b``'s, has ``a u + b v = 1``; steadily it carries
    ``1 / (u + v)`` a second, which lies between ``a`` and ``b``. Not the requests it completed
    a second: an engine that runs hundreds at once, flooded, completes few while its batch fills
    (an H100 under 2,784 conversation prompts completed 15 in a window's second half, 3 req/s,
    where 16.5 req/s met the SLOs), or the whole first batch at once. None where fewer than
    ``MIN_WINDOW_REQUESTS`` were served in ``half``: too few to say."""
    start, end = half
    if end <= start or not window:
        return None
    stopped = result.stopped_at_s if result.stopped_at_s is not None else result.duration_s
    prompts, outputs, served = 0.0, 0.0, 0
    for live in result.live:
        first = live.first_token_s
        if first is None:
            continue
        last = live.done_s if live.done_s is not None else max(stopped, first)
        began = start <= first <= end
        if began:
            prompts += live.input_tokens
        if last > first:
            outputs += live.tokens * max(0.0, min(last, end) - max(first, start)) / (last - first)
        elif began:
            outputs += live.tokens
        if began or (first < end and last >= start):
            served += 1
    if served < MIN_WINDOW_REQUESTS:  # fewer say too little to bound a capacity by
        return None
    seconds = end - start
    prompt = sum(q.input_tokens for q in window) / len(window)
    output = sum(q.output_tokens for q in window) / len(window)
    readings = [
        tokens / seconds / mean for tokens, mean in ((prompts, prompt), (outputs, output)) if mean
    ]
    return served, max(readings, default=0.0)


def _ready(
    base_url: str,
    settings: CapacitySettings,
    replay_settings: ReplaySettings,
    rate: float,
    index: int,
    lead_s: float,
    span_s: float | None = None,
) -> tuple[list[Request], ReplaySettings, dict[str, float]]:
    """A rate's window (``lead_s`` and ``span_s`` more, by default ``settings.span_s``) and
    its replay settings, seeded by ``index``, the server made ready for it: waited on until
    idle, its prefix cache primed with the blocks the trace sent before the window
    (``tuner.load.priming``), or, with none to prime, reset where the server allows; with
    what that found (``started_idle``, ``prefix_cache_reset`` and the priming's figures)."""
    idle = wait_idle(base_url)
    # A primed cache is kept: of this window's blocks, the next one finds only the trace's
    # history (the rest come from this window's seed), which its priming would send again.
    reset = not replay_settings.cached_ids and reset_prefix_cache(base_url)
    window = at_rate(
        settings.requests,
        settings.period_s,
        rate,
        lead_s + (settings.span_s(rate) if span_s is None else span_s),
        replay_settings.cached_ids,
    )
    seeded = replace(replay_settings, seed=replay_settings.seed + SEED_STRIDE * (index + 1))
    primed = prime(base_url, window, seeded)
    ready = {"started_idle": float(idle), "prefix_cache_reset": float(reset)}
    return window, seeded, ready | primed.figures()


def _sent_figures(result: ReplayResult, lead_s: float) -> dict[str, float]:
    """What a rate sent, its lead-in included: its requests, the lead-in's seconds, and the
    window's throughput (the lead-in's requests are served too)."""
    out = {"requests_sent": float(len(result.results)), "lead_s": lead_s}
    if result.stopped_at_s is None and result.duration_s > 0:
        sent = summarize_client(result.results, result.duration_s)
        out |= {k: v for k, v in sent.items() if k.startswith("throughput_")}
    return out


def _why_failed(judged: Judged, lost: Sequence[str]) -> str | None:
    """Why a rate failed: the SLOs it lost before it was stopped, or those it missed and the
    requests that failed; None where it passed."""
    if judged.stopped_at_s is not None:
        return f"stopped {judged.stopped_at_s:.0f} s in: {', '.join(lost)} lost"
    missed = judged.score.violations
    reasons = [f"missed {', '.join(missed)}"] if missed else []
    if missed and SHARE_MET in judged.figures:
        met, share = judged.figures[SHARE_MET], judged.figures[GOODPUT_SHARE]
        reasons = [f"{met:.0%} of requests met every SLO, short of {share:.0%}"]
    if judged.errors:
        reasons.append(f"{len(judged.errors)} requests failed")
    return "; ".join(reasons) or None


def after_lead_in(result: ReplayResult, lead_s: float) -> ReplayResult:
    """The replay's requests scheduled at or after ``lead_s``: those a rate is judged on."""
    if lead_s <= 0:
        return result
    return replace(
        result,
        results=[r for r in result.results if r.scheduled_s >= lead_s],
        live=[r for r in result.live if r.scheduled_s >= lead_s],
    )


def measure_capacity(
    base_url: str,
    settings: CapacitySettings,
    replay_settings: ReplaySettings,
    criteria: Criteria,
    on_rate: OnRate | None = None,
) -> CapacityFound:
    """Search the capacity of the server at ``base_url`` (already healthy, warmed up), each
    rate judged by ``criteria`` (the spec's SLOs, weights and ``max_error_rate``), beginning
    with a saturating window (``measure_saturated``) where ``settings.saturates``."""
    windows = itertools.count()
    lead_s = settings.lead_s(settings.hint.e2e_s if settings.hint is not None else None)

    def measure(rate: float) -> RatePoint:
        nonlocal lead_s
        index = next(windows)
        point = measure_rate(
            base_url, settings, replay_settings, criteria, rate, index, on_rate, lead_s
        )
        lead_s = settings.lead_s(point.figures.get("e2e_p50_s", lead_s))
        return point

    def saturate(rate: float) -> RatePoint:
        index = next(windows)
        how = (settings, replay_settings, criteria)
        return measure_saturated(base_url, *how, rate, index, on_rate)

    found = search_capacity(
        measure,
        settings.start_req_per_s,
        settings.resolution,
        settings.max_probes,
        settings.floor_req_per_s,
        first_step=settings.first_step,
        gate_req_per_s=settings.gate_req_per_s,
        saturate=saturate if settings.saturates else None,
    )
    compare = settings.compare_req_per_s
    if compare is None or compare <= found.capacity_req_per_s or not found.points:
        return found
    return replace(found, compared=measure(compare))
