"""What ``tuner report`` shows of a study by its objective: one ``Presenter`` per
``objective_mode`` in ``PRESENTERS`` (the objective holds no words,
``tuner.study.setup.objective``), asked through ``presenter_of``.

A presenter says the verdict's words of the chosen configuration, names the value's axis, and
lists the parts of the page that follow from how its trials were measured: the rows of the
verdict's table and the columns of the trials' table in order (``VALUE``, ``RATES``,
``FIGURES``), and the figures drawn (``tuner.report.build.FIGURES``'s names), which
``tuner.report.page`` and ``tuner.report.build`` render.

- ``ScorePresenter``: a latency study's score, after each trial's figures; no rate figure.
- ``RatePresenter``: a capacity study's rate first, the rates each trial measured beside it,
  and latency against offered rate.
- ``GoodputPresenter``: as capacity, with the share of requests that met every SLO drawn
  against offered rate first, its required share dashed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from tuner.study.capacity.text import num
from tuner.study.measure.judge import GOODPUT_SHARE, SHARE_MET
from tuner.study.setup.objective import (
    CAPACITY_OBJECTIVE,
    GOODPUT_OBJECTIVE,
    LATENCY_OBJECTIVE,
    OBJECTIVES,
    StudyObjective,
)

# The parts of the verdict's table and the trials' table: the study's value, the rates a trial
# measured, and the SLO figures (the verdict's) or the table's figures (the trials').
VALUE, RATES, FIGURES = "value", "rates", "figures"
# The figures a page may draw, by file name.
RATES_FIGURE = "rates.png"
LANDSCAPE, TRIALS, HISTORY, COST = "landscape.png", "trials.png", "history.png", "cost.png"


class Presenter:
    """A latency study as the page shows it: the score (lower is better) after the figures."""

    value_label: ClassVar[str] = "score (lower is better)"
    # Where a trial's figures were measured, where not at one load: "" (the window's).
    figures_at: ClassVar[str] = ""
    rows: ClassVar[tuple[str, ...]] = (FIGURES, VALUE)
    figures: ClassVar[tuple[str, ...]] = (LANDSCAPE, TRIALS, HISTORY, COST)
    # The rate figure's panels drawn before the latencies (a figure of the rate points).
    rate_panels: ClassVar[tuple[str, ...]] = ()
    # What the rate figure's star marks; and the same in the figure's key, in a few words.
    star: ClassVar[str] = ""
    star_key: ClassVar[str] = ""
    # The study's value, as the rate figure's configurations are ordered by it.
    what: ClassVar[str] = "score"

    def meets(self, value: float, figures: Mapping[str, Any]) -> str:
        """What the chosen configuration (its value ``value``, its ``figures``) does, in the
        verdict."""
        return "meets every SLO"

    def among(self, count: int, confirmed: bool) -> str:
        """What the chosen configuration is best among, as the verdict's sentence goes on from
        ``meets``: ``count`` feasible configurations ranked by their medians (``confirmed``),
        else ``count`` feasible trials."""
        if confirmed:
            return f", with the best median score of {count} feasible {_configurations(count)}"
        return f", with the best score of the {count} feasible trials"

    def defaults(self, number: int, value: float) -> str:
        """What the verdict adds of vLLM's defaults (trial ``number``, its value ``value``) where
        no confirmation compared them: nothing."""
        return ""


class RatePresenter(Presenter):
    """A capacity study as the page shows it: the rate found leads, the SLO figures measured
    there follow, and each configuration's latency is drawn against offered rate."""

    value_label = "capacity (req/s, higher is better)"
    figures_at = "those at its capacity (at the lowest rate it tried, where none passed)"
    rows = (VALUE, RATES, FIGURES)
    figures = (RATES_FIGURE, *Presenter.figures)
    star = "the configuration's capacity, the highest rate at which it met every SLO"
    star_key = "capacity (highest rate passed)"
    what = "capacity"

    def meets(self, value: float, figures: Mapping[str, Any]) -> str:
        return f"carries {num(value)} req/s within every SLO"

    def among(self, count: int, confirmed: bool) -> str:
        if confirmed:
            what = f"the highest median {self.what} of {count} {_configurations(count)}"
        else:
            what = f"the highest {self.what} of the {count} trials"
        return f": {what} that met them at some rate"

    def defaults(self, number: int, value: float) -> str:
        return f" vLLM's defaults (trial {number}) carry {num(value)} req/s."


class GoodputPresenter(RatePresenter):
    """A goodput study: as capacity, each rate judged by the share of its requests that met
    every SLO, drawn first."""

    value_label = "goodput (req/s, higher is better)"
    figures_at = "those at its goodput (at the lowest rate it tried, where none passed)"
    rate_panels = (SHARE_MET,)
    star = (
        "the configuration's goodput, the highest rate at which enough of its requests met every "
        "SLO"
    )
    star_key = "goodput (highest rate with enough requests within every SLO)"
    what = "goodput"

    def meets(self, value: float, figures: Mapping[str, Any]) -> str:
        share = figures.get(GOODPUT_SHARE)
        held = "enough" if not isinstance(share, int | float) else f"{share:.0%}"
        return f"carries {num(value)} req/s with {held} of its requests within every SLO"


SCORE_PRESENTER, RATE_PRESENTER = Presenter(), RatePresenter()
PRESENTERS: dict[str, Presenter] = {
    LATENCY_OBJECTIVE.mode: SCORE_PRESENTER,
    CAPACITY_OBJECTIVE.mode: RATE_PRESENTER,
    GOODPUT_OBJECTIVE.mode: GoodputPresenter(),
}
assert set(PRESENTERS) == set(OBJECTIVES)


def presenter_of(objective: StudyObjective) -> Presenter:
    """How the page shows a study of ``objective``."""
    return PRESENTERS[objective.mode]


def _configurations(count: int) -> str:
    return "configuration" if count == 1 else "configurations"
