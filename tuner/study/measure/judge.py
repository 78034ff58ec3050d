"""The judge of a replayed window: what it measured, whether it met the SLOs, whether tuner's
client kept up with it, and where it was stopped early.

Every window is judged here: a trial's (``tuner.study.measure.trial``), each rate of a capacity
search (``tuner.study.capacity.probes``) and so each rate of a latency study's calibration
(``tuner.study.setup.calibrate``). A window that ran to its end is judged on the figures of
the whole replay (``tuner.load.metrics.replay_figures``); one its monitor stopped, on the
figures so far (``tuner.load.metrics.provisional``: a request still waiting counts with its
wait so far) and the client's own. Either is scored against the SLOs and the error rate
(``tuner.study.measure.scoring``), and tuner's client is asked whether it kept up
(``tuner.load.health``). A window stopped early never passes. A goodput study's rates are
judged instead by the share of their requests that met every SLO (``judge_goodput``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tuner.load.health import CLIENT_TOLERANCE_S, client_behind, client_to_blame
from tuner.load.metrics import (
    ReplayResult,
    RequestResult,
    client_figures,
    provisional,
    replay_figures,
)
from tuner.study.measure.scoring import Criteria, Score, score


@dataclass(frozen=True)
class Judged:
    """A replayed window judged: what it measured (``figures``); its ``score`` against the SLOs
    and the error rate; the errors of the requests that failed, in the window's order; the
    seconds into the window at which it was stopped early (None where it ran to its end); why
    tuner's client fell behind (``client_behind``, None where it kept up), and why the window's
    result may be the client's rather than the server's (``client_to_blame``: it fell behind,
    and the window passed or missed no SLO by more than the client's lateness explains)."""

    figures: dict[str, float]
    score: Score
    errors: tuple[str, ...]
    stopped_at_s: float | None
    client_behind: str | None
    client_to_blame: str | None

    @property
    def passed(self) -> bool:
        """Ran to its end, every SLO met, and no more requests failed than allowed."""
        return self.stopped_at_s is None and self.score.feasible


def judge(
    result: ReplayResult, criteria: Criteria, tolerance_s: float = CLIENT_TOLERANCE_S
) -> Judged:
    """Judge what one replay saw against ``criteria``; tuner's client kept up if it added no
    more than ``tolerance_s`` to a latency (``tuner.load.health.client_behind``)."""
    stopped_at_s = result.stopped_at_s
    if stopped_at_s is None:
        figures = replay_figures(result)
    else:
        figures = provisional(stopped_at_s, result.live)
        figures["stopped_at_s"] = stopped_at_s
        figures |= client_figures(result)
    judged = score(figures, criteria)
    passed = stopped_at_s is None and judged.feasible
    return Judged(
        figures,
        judged,
        tuple(r.error for r in result.results if r.error),
        stopped_at_s,
        client_behind(figures, tolerance_s),
        client_to_blame(figures, criteria.slos, passed, tolerance_s),
    )


# A goodput window's figures: the share of its requests that met every SLO, each on its own
# figures, and the share it was held to (the spec's ``goodput_share``); and its one constraint.
SHARE_MET = "slo_met_share"
GOODPUT_SHARE = "goodput_share"
GOODPUT = "goodput"
# The per-request figure each SLO's metric holds a request to: ``ttft_p95_s`` its TTFT.
REQUEST_FIGURES = ("ttft", "tpot", "e2e")


def request_limits(slos: Mapping[str, float]) -> dict[str, float]:
    """The limit each request's own TTFT, TPOT and end-to-end time is held to: of the SLOs on
    one figure (``ttft_p50_s`` and ``ttft_p95_s``), the lowest."""
    limits: dict[str, float] = {}
    for metric, limit in slos.items():
        figure = metric.partition("_p")[0]
        if figure in REQUEST_FIGURES:
            limits[figure] = min(limit, limits.get(figure, limit))
    return limits


def met_every_slo(result: RequestResult, limits: Mapping[str, float]) -> bool:
    """Whether one request succeeded with its TTFT, TPOT and end-to-end time each within its
    limit (``request_limits``). A TPOT is held only where the request has one (two tokens or
    more); a TTFT or end-to-end time not measured is a miss."""
    if not result.ok:
        return False
    figures = {"ttft": result.ttft_s, "tpot": result.tpot_s, "e2e": result.e2e_s}
    for figure, limit in limits.items():
        value = figures[figure]
        if value is None and figure == "tpot":
            continue
        if value is None or value > limit:
            return False
    return True


def met_share(results: Sequence[RequestResult], slos: Mapping[str, float]) -> float:
    """The share of ``results`` (failed requests included) that met every SLO; 0 of none."""
    if not results:
        return 0.0
    limits = request_limits(slos)
    return sum(met_every_slo(r, limits) for r in results) / len(results)


def judge_goodput(
    result: ReplayResult,
    criteria: Criteria,
    share: float,
    tolerance_s: float = CLIENT_TOLERANCE_S,
) -> Judged:
    """Judge one replay by the share of its requests that met every SLO: passed where it ran to
    its end and at least ``share`` of them did (a failed request is one that did not). Its
    figures are ``judge``'s, with ``SHARE_MET`` and ``GOODPUT_SHARE``; its one constraint,
    ``GOODPUT``, is how far the share met fell short, as a fraction of ``share``."""
    judged = judge(result, criteria, tolerance_s)
    met = met_share(result.results, criteria.slos)
    figures = judged.figures | {SHARE_MET: met, GOODPUT_SHARE: share}
    passed = judged.stopped_at_s is None and met >= share
    return Judged(
        figures,
        Score(met, {GOODPUT: (share - met) / share}),
        judged.errors,
        judged.stopped_at_s,
        judged.client_behind,
        client_to_blame(figures, criteria.slos, passed, tolerance_s),
    )
