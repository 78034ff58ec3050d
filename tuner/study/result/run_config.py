"""A run's configuration: what the command line and the study spec say of one run, resolved
once and handed whole to ``tuner.study.result.run.Run``.

``resolve`` is the one place where a value given for the run (by ``tuner run``'s command line,
or a benchmark) meets the spec's: a value given beats the spec's, the spec's stands where none
is given, and where the spec leaves it out its parser's default is the spec's value. ``Run``
reads the ``RunConfig`` and resolves nothing again.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from tuner.engine.launchers import AUTO as AUTO_LAUNCHER
from tuner.study.measure.scoring import Criteria
from tuner.study.plan.layouts import Layout
from tuner.study.plan.spec import StudySpec
from tuner.study.setup.calibrate import TimeScale


def default_storage(study: str) -> str:
    """The study's storage where none is given: ``studies/NAME.db``, a SQLite file."""
    return f"sqlite:///studies/{study}.db"


@dataclass(frozen=True)
class RunConfig:
    """One run, resolved: its study and storage (an Optuna URL), where its engine logs go
    (``run_dir``) and the configuration it answers is written (``config_path``), how many
    trials it adds (none with ``confirm_only``, which only finishes a confirmation), its time
    budget in seconds from ``began`` (``time.monotonic()``; None: no budget; ``budget_given``:
    set for the run, not taken from the spec), the window's seconds in the trace, its time scale
    as given (a number or ``auto``: ``TimeScale``), the launcher asked for (a name of
    ``tuner.engine.launchers.LAUNCHERS``, or ``auto``), the study's seed, the SLO criteria
    every trial, capacity search, calibration and confirmation is judged by, and the layout
    every trial runs at where one is given (``tuner run --layout``; None: the study's kept
    layout, else vLLM's default)."""

    study: str
    storage: str
    run_dir: Path
    config_path: Path
    n_trials: int
    confirm_only: bool
    time_budget_s: float | None
    budget_given: bool
    window_s: float
    time_scale: TimeScale
    launcher: str
    seed: int
    criteria: Criteria
    began: float
    layout: Layout | None = None

    @property
    def measures(self) -> bool:
        """Whether the run starts engines: to add trials, or to finish a confirmation."""
        return bool(self.n_trials or self.confirm_only)


def resolve(
    spec: StudySpec,
    study: str,
    run_dir: Path,
    config_path: Path,
    *,
    storage: str | None = None,
    n_trials: int | None = None,
    confirm_only: bool = False,
    time_budget_s: float | None = None,
    window_s: float | None = None,
    time_scale: float | None = None,
    launcher: str = AUTO_LAUNCHER,
    began: float | None = None,
    layout: Layout | None = None,
) -> RunConfig:
    """The run's configuration: each value given (not None) over the spec's ``n_trials``,
    ``time_budget_s``, ``window_s`` and ``time_scale``, the spec's where none is given;
    ``confirm_only`` adds no trial whatever the count; the storage ``default_storage`` where
    none is given; the budget counted from ``began``, else from now."""
    return RunConfig(
        study=study,
        storage=default_storage(study) if storage is None else storage,
        run_dir=run_dir,
        config_path=config_path,
        n_trials=0 if confirm_only else spec.n_trials if n_trials is None else n_trials,
        confirm_only=confirm_only,
        time_budget_s=spec.time_budget_s if time_budget_s is None else time_budget_s,
        budget_given=time_budget_s is not None,
        window_s=spec.window_s if window_s is None else window_s,
        time_scale=TimeScale(spec.time_scale if time_scale is None else time_scale),
        launcher=launcher,
        seed=spec.seed,
        criteria=Criteria.of(spec),
        began=time.monotonic() if began is None else began,
        layout=layout,
    )
