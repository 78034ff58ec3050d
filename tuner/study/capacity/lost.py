"""When a window's SLOs are lost for certain: more of its requests are already past a limit,
whatever the rest do, than its percentile (``lost_slos``) or its goodput share
(``lost_goodput``) lets through. Pure: a capacity search's window
(``tuner.study.capacity.probes.measure_rate``) asks these every second and stops once lost.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from tuner.load.metrics import LiveRequest
from tuner.study.measure.judge import GOODPUT, request_limits


def lost_slos(
    now_s: float,
    live: Sequence[LiveRequest],
    total: int,
    slos: Mapping[str, float],
    decoding: int | None = None,
) -> list[str]:
    """The TTFT, TPOT and end-to-end SLOs that the window can no longer meet, whatever comes
    next.

    ``metric_pQ_s`` over ``total`` requests is above its limit once the requests already past
    it (lower bounds: a request still waiting counts with its wait so far, which only grows)
    reach ``total - floor(Q/100 * (total - 1))``: then the value at the percentile's lower rank is
    past the limit, and with it the interpolated percentile. Only requests already sent count:
    one still waiting for tuner's own client to send it is waiting on tuner, not the server,
    and its figures will count from when it is sent (on a 2-core machine with vLLM on both
    cores, the client ran up to 2.4 s late, and a window passing at 742 ms TTFT p95 was
    stopped as lost when the scheduled times counted). A TPOT counts only once its request is
    done (until then it may still fall), over the ``decoding`` requests that have one (those
    asking for two tokens or more; ``total`` where not given): fewer in the end, should some
    fail before their first token, only lower the count a loss needs.
    """
    lost = []
    for metric, limit in slos.items():
        prefix, _, rest = metric.partition("_p")
        if prefix not in ("ttft", "tpot", "e2e") or not rest.endswith("_s"):
            continue
        quantile = float(rest.removesuffix("_s"))
        among = total if prefix != "tpot" or decoding is None else decoding
        needed = among - math.floor(quantile / 100 * (among - 1))
        over = sum(1 for r in live if r.sent and _past(r, prefix, now_s, limit))
        if among > 0 and over >= needed:
            lost.append(metric)
    return lost


def lost_goodput(
    now_s: float,
    live: Sequence[LiveRequest],
    total: int,
    slos: Mapping[str, float],
    share: float,
) -> list[str]:
    """``[GOODPUT]`` once more of the window's ``total`` requests are past a limit for good
    (``tuner.study.measure.judge.request_limits``: a request still waiting counts with its wait
    so far) than ``share`` lets miss; else nothing. Only requests already sent count, as in
    ``lost_slos``."""
    limits = request_limits(slos)
    over = sum(
        1
        for r in live
        if r.sent and any(_past(r, figure, now_s, limit) for figure, limit in limits.items())
    )
    may_miss = total - math.ceil(share * total - 1e-9)
    return [GOODPUT] if total > 0 and over > may_miss else []


def _past(request: LiveRequest, prefix: str, now_s: float, limit_s: float) -> bool:
    """Whether ``request``'s figure ``prefix`` (``ttft``, ``tpot``, ``e2e``) is past
    ``limit_s`` for good at ``now_s``."""
    if prefix == "tpot":
        tpot_s = request.tpot_s
        return tpot_s is not None and tpot_s > limit_s
    end_s = request.first_token_s if prefix == "ttft" else request.done_s
    return (now_s if end_s is None else end_s) - request.sent_s > limit_s
