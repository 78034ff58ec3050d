"""``tuner report``'s work: read a study, draw its figures, write one HTML page beside them.

The page does not need the network: every figure is embedded in it (a ``data:`` URI) and also
written beside it as a PNG. The trial it puts first is the one ``tuner run`` writes: the best
feasible trial, else the closest (``tuner.study.search``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from tuner.flags import SERVER_ONLY, config_yaml
from tuner.report import plots
from tuner.report.data import (
    Configuration,
    StudyReport,
    rows_of,
    searched_parameters,
    slo_limits,
)
from tuner.report.page import render
from tuner.study import picks, search

if TYPE_CHECKING:
    from optuna.trial import FrozenTrial

HTML_NAME = "index.html"
WRITTEN_BY = re.compile(r"^# Study '(?P<study>.*)', trial (?P<trial>\d+)\.$", re.MULTILINE)


def read_report(name: str, storage: str, configs: Path) -> StudyReport:
    study = search.load_existing(name, storage)
    trials = study.get_trials(deepcopy=False)
    best = picks.best_trial(study)
    chosen = best or picks.closest_trial(study)
    baseline = picks.baseline_trial(study)
    rows = rows_of(trials)
    configuration = None
    if chosen is not None:
        configuration = read_configuration(configs / f"{name}.yaml", name, chosen)
    return StudyReport(
        name=name,
        storage=storage,
        rows=rows,
        parameters=searched_parameters(trials),
        slos=slo_limits(rows),
        chosen=None if chosen is None else chosen.number,
        meets_slos=best is not None,
        baseline=None if baseline is None else baseline.number,
        configuration=configuration,
    )


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


FIGURES: tuple[tuple[str, Callable[[StudyReport, Path], Path | None]], ...] = (
    ("landscape.png", lambda r, p: plots.plot_landscape(r.rows, r.parameters, r.slos, p)),
    ("trials.png", lambda r, p: plots.plot_trials(r.rows, r.slos, p)),
    ("history.png", lambda r, p: plots.plot_history(r.rows, p)),
    ("cost.png", lambda r, p: plots.plot_cost(r.rows, p)),
)


def write_report(name: str, storage: str, out: Path, configs: Path) -> Path:
    """Write ``out/index.html`` and its PNGs; return the page's path."""
    report = read_report(name, storage, configs)
    out.mkdir(parents=True, exist_ok=True)
    images: dict[str, bytes] = {}
    for file_name, draw in FIGURES:
        written = draw(report, out / file_name)
        if written is not None:
            images[file_name] = written.read_bytes()
        else:
            (out / file_name).unlink(missing_ok=True)  # from an earlier report of the study
    page = out / HTML_NAME
    page.write_text(render(report, images), encoding="utf-8")
    return page
