"""``tuner report``'s work: read a study, draw its figures, write one HTML page beside them.

The page does not need the network: every figure is embedded in it (a ``data:`` URI) and also
written beside it as a PNG. The trial it puts first is the one ``tuner run`` writes, chosen by
``tuner.study.result.choice.choose``: the feasible configuration with the best median over its
measurements (the lowest score; in a capacity study the highest capacity), else the closest.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuner.flags import SERVER_ONLY, config_yaml
from tuner.report import plots
from tuner.report.data import (
    Configuration,
    StudyReport,
    measured_by,
    recorded_slos,
    rows_of,
    searched_parameters,
    slo_limits,
)
from tuner.report.page import render
from tuner.report.presenters import presenter_of
from tuner.report.rate_curves import rate_curves_of, rate_limits
from tuner.report.rate_plot import plot_rates
from tuner.study.measure.time_spent import time_lines
from tuner.study.result.choice import Choice, choose, summary
from tuner.study.setup.objective import of_study
from tuner.study.store.record import VLLM_DEFAULTS, TrialRecord
from tuner.study.trials import picks, search
from tuner.study.trials.fingerprint import WORKLOAD_ATTR
from tuner.study.trials.groups import groups
from tuner.urls import shown_url

if TYPE_CHECKING:
    from optuna.study import Study
    from optuna.trial import FrozenTrial

HTML_NAME = "index.html"
WRITTEN_BY = re.compile(r"^# Study '(?P<study>.*)', trial (?P<trial>\d+)\.$", re.MULTILINE)


def read_report(name: str, storage: str, configs: Path) -> StudyReport:
    """Everything ``tuner report`` shows of study NAME: its trials, choice, baseline and the
    configuration written for it under ``configs``."""
    study = search.load_existing(name, storage)
    trials = study.get_trials(deepcopy=False)
    choice = choose(study)
    baseline = picks.baseline_trial(study)
    rows = rows_of(trials)
    configuration = None
    if choice is not None:
        configuration = read_configuration(configs / f"{name}.yaml", name, choice.trial)
    # The outcome's lines where the study was confirmed or the defaults kept, as tuner run said.
    said = choice is not None and (
        choice.confirmation or choice.keeps_defaults or choice.unconfirmed
    )
    outcome = summary(choice, vllm_defaults(study)) if choice is not None and said else []
    return StudyReport(
        name=name,
        storage=shown_url(storage),
        rows=rows,
        parameters=searched_parameters(trials),
        # As the spec gave them where tuner run recorded them; else as the trials were held to.
        slos=recorded_slos(study.user_attrs) or slo_limits(rows),
        chosen=None if choice is None else choice.trial.number,
        meets_slos=choice is not None and choice.meets_slos,
        baseline=None if baseline is None else baseline.number,
        configuration=configuration,
        baseline_name=VLLM_DEFAULTS if baseline is None else TrialRecord.of(baseline).baseline_name,
        objective=of_study(study),
        measurements=() if choice is None else choice.measurements,
        confirmation=tuple(outcome),
        feasible_configurations=sum(g.feasible for g in groups(study)),
        kept_because=choice.why if choice is not None and choice.keeps_defaults else "",
        unconfirmed_because=choice.why if choice is not None and choice.unconfirmed else "",
        closest=choice.closest.number if choice is not None and choice.closest else None,
        time_spent=time_spent(study, choice, baseline),
        measured_by=measured_by(trials),
    )


def vllm_defaults(study: Study) -> dict[str, Any]:
    """vLLM's own values of the searched engine arguments, as the study's spec gave them."""
    workload = study.user_attrs.get(WORKLOAD_ATTR)
    space = workload.get("search_space") if isinstance(workload, Mapping) else None
    if not isinstance(space, Mapping):
        return {}
    return {
        name: dim.get("default")
        for name, dim in space.items()
        if isinstance(dim, Mapping) and dim.get("has_default")
    }


def time_spent(
    study: Study, choice: Choice | None, baseline: FrozenTrial | None
) -> tuple[str, ...]:
    """Where the chosen trial's time went, and the baseline's where it is not one of the chosen
    configuration's measurements."""
    if choice is None:
        return ()
    defaults = vllm_defaults(study)
    chosen = TrialRecord.of(choice.trial)
    lines = time_lines(
        chosen.number, chosen.figures, defaults, choice.keeps_defaults, chosen.engine_args
    )
    if baseline is not None and baseline.number not in (chosen.number, *choice.measurements):
        held = TrialRecord.of(baseline)
        lines += time_lines(held.number, held.figures, defaults, False, held.engine_args)
    return tuple(lines)


def read_configuration(path: Path, name: str, chosen: FrozenTrial) -> Configuration:
    """``configs/NAME.yaml`` as ``tuner run`` wrote it, or the chosen trial's arguments."""
    if path.is_file():
        text = path.read_text()
        match = WRITTEN_BY.search(text)
        trial = int(match["trial"]) if match and match["study"] == name else None
        return Configuration(path, text, written=True, trial=trial)
    args = picks.engine_args_of(chosen)
    shown = {k: v for k, v in args.items() if k not in SERVER_ONLY}
    return Configuration(path, config_yaml(shown), written=False, trial=None)


def _rates(report: StudyReport, path: Path) -> Path | None:
    """Latency against offered rate, with the panels the study's presenter draws first."""
    shown = presenter_of(report.objective)
    drawn = rate_curves_of(report, shown.rate_panels)
    return plot_rates(drawn, rate_limits(report), path, shown)


FIGURES: tuple[tuple[str, Callable[[StudyReport, Path], Path | None]], ...] = (
    ("rates.png", _rates),
    (
        "landscape.png",
        lambda r, p: plots.plot_landscape(r.rows, r.parameters, r.slos, p, r.objective),
    ),
    ("trials.png", lambda r, p: plots.plot_trials(r.rows, r.slos, p)),
    ("history.png", lambda r, p: plots.plot_history(r.rows, p, r.objective)),
    ("cost.png", lambda r, p: plots.plot_cost(r.rows, p)),
)


def write_report(name: str, storage: str, out: Path, configs: Path) -> Path:
    """Write ``out/index.html`` and its PNGs; return the page's path."""
    report = read_report(name, storage, configs)
    out.mkdir(parents=True, exist_ok=True)
    images: dict[str, bytes] = {}
    drawn = presenter_of(report.objective).figures
    for file_name, draw in FIGURES:
        written = draw(report, out / file_name) if file_name in drawn else None
        if written is not None:
            images[file_name] = written.read_bytes()
        else:
            (out / file_name).unlink(missing_ok=True)  # from an earlier report of the study
    page = out / HTML_NAME
    page.write_text(render(report, images), encoding="utf-8")
    return page
