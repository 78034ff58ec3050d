"""What a study found, for people: its trials as rows and series (``data``), the figures
(``plots``, shared with the GPU runner in ``benchmarks/gpu``) and one HTML page (``page``,
``build``), what each objective shows (``presenters``); a capacity study's latency against
offered rate per configuration (``rate_curves``, ``rate_plot``).

Reads a study that ``tuner run`` wrote, through ``tuner.study.trials.search``; writes nothing
into it.

The names offered to code outside tuner (``benchmarks/``, an embedding program) are in
``__all__``, each imported from its module when first used (``tuner.face``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tuner.face import lazy

if TYPE_CHECKING:
    from tuner.report.build import read_report
    from tuner.report.data import (
        FEASIBLE,
        INTERRUPTED,
        RUNNING,
        StudyReport,
        TrialRow,
        cost,
        row_of,
        rows_of,
        searched_parameters,
        slo_limits,
    )
    from tuner.report.plots import plot_cost, plot_history, plot_landscape, plot_trials
    from tuner.report.presenters import RATES, RATES_FIGURE, presenter_of
    from tuner.report.rate_curves import MOST_CURVES, curves
    from tuner.report.rate_plot import plot_rates

_FACE = {
    "FEASIBLE": "tuner.report.data",
    "INTERRUPTED": "tuner.report.data",
    "MOST_CURVES": "tuner.report.rate_curves",
    "RATES": "tuner.report.presenters",
    "RATES_FIGURE": "tuner.report.presenters",
    "RUNNING": "tuner.report.data",
    "StudyReport": "tuner.report.data",
    "TrialRow": "tuner.report.data",
    "cost": "tuner.report.data",
    "curves": "tuner.report.rate_curves",
    "plot_cost": "tuner.report.plots",
    "plot_history": "tuner.report.plots",
    "plot_landscape": "tuner.report.plots",
    "plot_rates": "tuner.report.rate_plot",
    "plot_trials": "tuner.report.plots",
    "presenter_of": "tuner.report.presenters",
    "read_report": "tuner.report.build",
    "row_of": "tuner.report.data",
    "rows_of": "tuner.report.data",
    "searched_parameters": "tuner.report.data",
    "slo_limits": "tuner.report.data",
}

__all__ = [
    "FEASIBLE",
    "INTERRUPTED",
    "MOST_CURVES",
    "RATES",
    "RATES_FIGURE",
    "RUNNING",
    "StudyReport",
    "TrialRow",
    "cost",
    "curves",
    "plot_cost",
    "plot_history",
    "plot_landscape",
    "plot_rates",
    "plot_trials",
    "presenter_of",
    "read_report",
    "row_of",
    "rows_of",
    "searched_parameters",
    "slo_limits",
]

__getattr__, __dir__ = lazy(__name__, _FACE)
