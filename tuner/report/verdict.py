"""The verdict in words: which trial tuner chose (``tuner.study.result.choice``), what it is best
among, and what the confirm step found. Pure: text from a ``StudyReport``, escaped for HTML.

Where the study was confirmed, configurations are ranked by the median of their measurements,
and the chosen trial is its configuration's median measurement: the one ``tuner run`` wrote.
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

from tuner.report.data import FEASIBLE, StudyReport, TrialRow
from tuner.report.presenters import presenter_of
from tuner.study.measure.scoring import verdict
from tuner.study.result.emit import verdict_lines
from tuner.study.store.record import VLLM_DEFAULTS


def listed(items: Sequence[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def chosen_is_baseline(report: StudyReport) -> bool:
    """Whether the chosen configuration is vLLM's defaults: the baseline's first trial, or a
    re-measurement of it, was chosen."""
    if report.baseline is None or report.chosen is None:
        return False
    return report.baseline in (report.chosen, *report.measurements)


def median_of(report: StudyReport) -> str:
    """`` (the median of its 3 measurements: trials 0, 11 and 14)``; nothing if measured once."""
    count = len(report.measurements)
    if count < 2:
        return ""
    trials = listed([str(n) for n in report.measurements])
    which = "median" if count % 2 else "worse middle"  # as Group.median_trial takes it
    return f" (the {which} of its {count} measurements: trials {trials})"


def among(report: StudyReport) -> str:
    """What the chosen trial is best among, in its presenter's words (``Presenter.among``): the
    feasible trials, or where the study was confirmed, the feasible configurations by their
    medians."""
    confirmed = confirmed_lines(report)
    if confirmed:
        count = report.feasible_configurations
    else:
        count = sum(r.outcome == FEASIBLE for r in report.rows)
    return presenter_of(report.objective).among(count, confirmed)


def confirmed_lines(report: StudyReport) -> bool:
    """Whether the report's confirmation lines are a confirm step's (or the defaults kept), not
    those of a configuration written unconfirmed, whose study measured nothing again."""
    return bool(report.confirmation) and not report.unconfirmed_because


def said(report: StudyReport, chosen: TrialRow) -> str:
    """The verdict, in a sentence or two."""
    measured = median_of(report)
    if not report.meets_slos:
        misses = verdict(chosen.constraints, chosen.figures)
        return f"No trial met the SLOs. The closest, trial {chosen.number}{measured}: " + "; ".join(
            escape(line.strip()) for line in verdict_lines(misses)[1:]
        )
    shown = presenter_of(report.objective)
    meets = f"Trial {chosen.number} {shown.meets(chosen.value or 0.0, chosen.figures)}{measured}"
    if report.kept_because:
        # vLLM's defaults were chosen (``choice.DEFAULTS``: the only way they are): why.
        mine = report.baseline_name != VLLM_DEFAULTS
        what = "your configuration (the spec's baseline)" if mine else "vLLM's own defaults"
        return f"{meets}. It is {what}, kept: {escape(report.kept_because)}."
    text = f"{meets}{among(report)}."
    baseline = next((r for r in report.rows if r.number == report.baseline), None)
    if baseline is not None and baseline.value is not None and not confirmed_lines(report):
        # Confirmed, the baseline's median is in the confirmation's lines instead.
        text += shown.defaults(baseline.number, baseline.value)
    if report.unconfirmed_because:
        # A searched configuration written with no test on fresh engines behind it
        # (``choice.UNCONFIRMED``): tuner run exited 3, and the page says why.
        text += f" Unconfirmed: it {escape(report.unconfirmed_because)}."
    return text


def confirmation_part(report: StudyReport) -> str:
    """The confirm step's lines, as ``tuner run`` prints them and the YAML header carries them;
    nothing for a study without re-measurements."""
    if not report.confirmation:
        return ""
    items = "".join(f"<li>{escape(line)}</li>" for line in report.confirmation)
    return f'<ul id="confirmation">{items}</ul>'
