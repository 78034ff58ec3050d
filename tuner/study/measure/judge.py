"""The judge of a replayed window: what it measured, whether it met the SLOs, whether tuner's
client kept up with it, and where it was stopped early.

Every window is judged here: a trial's (``tuner.study.measure.trial``), each rate of a capacity
search (``tuner.study.measure.capacity``) and so each rate of a latency study's calibration
(``tuner.study.measure.calibrate``). A window that ran to its end is judged on the figures of
the whole replay (``tuner.load.metrics.replay_figures``); one its monitor stopped, on the
figures so far (``tuner.load.metrics.provisional``: a request still waiting counts with its
wait so far) and the client's own. Either is scored against the SLOs and the error rate
(``tuner.study.measure.scoring``), and tuner's client is asked whether it kept up
(``tuner.load.health``). A window stopped early never passes.
"""

from __future__ import annotations

from dataclasses import dataclass

from tuner.load.health import CLIENT_TOLERANCE_S, client_behind, client_to_blame
from tuner.load.metrics import ReplayResult, client_figures, provisional, replay_figures
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
