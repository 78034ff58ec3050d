"""The study loop's own rules, on real Optuna studies and a stand-in trial runner.

The pruner: a trial far off (its worst metric-to-SLO ratio above ``factor``, or above ``factor``
times the best trial's at the same point) is stopped, never before ``after_step``; the baseline
and the spec's candidates report like any trial, so that the pruner can compare with them, but
are measured in full.
"""

from __future__ import annotations

import math
import sqlite3
import subprocess
import threading
import time
from dataclasses import replace
from pathlib import Path

import optuna
import pytest
from conftest import run_tuner, write_small_trace, write_spec
from optuna.trial import TrialState

from tuner.cli.result import trial_line
from tuner.errors import TunerError
from tuner.load.http import ReplaySettings
from tuner.study.capacity.probes import CapacitySettings, capacity_score
from tuner.study.capacity.rate_search import RateSearch
from tuner.study.measure.scoring import score
from tuner.study.measure.trial import Criteria, TrialOutcome, TrialSetup
from tuner.study.plan.spec import parse_spec
from tuner.study.setup.objective import CAPACITY_OBJECTIVE
from tuner.study.store.record import BELOW_ATTR, CAPACITY_ATTR
from tuner.study.trials.budget import Budget
from tuner.study.trials.search import FarOffPruner, open_study, pruner_for, run_study

SLOS = {"e2e_p99_s": 10.0}
WEIGHTS = {"e2e_p99_s": 1.0}


def in_memory(pruner: FarOffPruner) -> optuna.Study:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.create_study(direction="minimize", pruner=pruner)


def finished(study: optuna.Study, ratios: dict[int, float], value: float, feasible: bool) -> None:
    """A completed trial that reported ``ratios`` (step: worst SLO ratio) on its way."""
    trial = study.ask()
    trial.set_user_attr("feasible", feasible)
    for step, ratio in ratios.items():
        trial.report(ratio, step)
    study.tell(trial, value)


def stops_at(study: optuna.Study, ratios: dict[int, float]) -> int | None:
    """The step at which the pruner stops a trial reporting ``ratios``, or None."""
    trial = study.ask()
    for step, ratio in ratios.items():
        trial.report(ratio, step)
        if trial.should_prune():
            study.tell(trial, state=TrialState.PRUNED)
            return step
    study.tell(trial, 1.0)
    return None


def test_far_worse_than_the_best_at_the_same_step_is_pruned() -> None:
    study = in_memory(FarOffPruner(factor=3.0, after_step=10))
    # The baseline: best, feasible, with its ratios along the window.
    finished(study, {5: 0.5, 10: 0.6, 15: 0.5}, value=0.5, feasible=True)
    # 2.0 at step 10 is under the absolute line (3) but above 3 x 0.6 = 1.8.
    assert stops_at(study, {5: 2.0, 10: 2.0}) == 10
    # Within the factor at every step: measured in full.
    assert stops_at(study, {5: 1.7, 10: 1.7, 15: 1.4}) is None
    # Between the best's steps, compared with its last step before: 12 -> step 10 (0.6).
    assert stops_at(study, {12: 1.9}) == 12
    assert stops_at(study, {12: 1.7}) is None


def test_nothing_is_pruned_before_after_step() -> None:
    study = in_memory(FarOffPruner(factor=3.0, after_step=10))
    finished(study, {5: 0.5, 10: 0.6}, value=0.5, feasible=True)
    assert stops_at(study, {0: 50.0, 5: 50.0, 9: 50.0}) is None
    assert stops_at(study, {5: 50.0, 10: 50.0}) == 10


def test_the_absolute_rule_prunes_without_a_best_trial() -> None:
    study = in_memory(FarOffPruner(factor=3.0, after_step=10))
    assert stops_at(study, {10: 2.9, 15: 3.0}) is None  # no best: only ratio > factor counts
    assert stops_at(study, {10: 2.9, 15: 3.1}) == 15
    # An infeasible best is no reference either.
    finished(study, {10: 0.1}, value=0.01, feasible=False)
    assert stops_at(study, {10: 2.0}) is None


def test_factor_zero_prunes_nothing() -> None:
    study = in_memory(FarOffPruner(factor=0.0, after_step=0))
    finished(study, {5: 0.1}, value=0.1, feasible=True)
    assert stops_at(study, {5: 100.0, 10: 1000.0}) is None


# The study loop, with a stand-in runner that reports as ``run_trial`` does.

SPEC = {
    "model": "m",
    "dummy_model": None,
    "engine_args": {"load-format": "dummy"},
    "baseline": {"gpu-memory-utilization": 0.2},
    "candidates": [{"block-size": 16}],
    "search_space": {"max-num-seqs": {"type": "int", "low": 1, "high": 32}},
    "slos": SLOS,
    "weights": WEIGHTS,
    "prune_factor": 3.0,
    "prune_after_s": 10,
}


def stand_in_setup() -> TrialSetup:
    return TrialSetup(
        model="m",
        requests=(),
        replay=ReplaySettings(model="m", vocab_size=100),
        criteria=Criteria(slos=SLOS, weights=WEIGHTS),
    )


class Reporting:
    """A runner reporting ratios at steps 5, 10, 15, 20 as a window would (when it is given
    ``should_stop``); stopped if told.

    The baseline's ratio is 0.5; the candidate (block size 16) is hopeless, 20 x its SLO; searched
    trials are at 2.0, within the absolute line but 4 times the baseline's.
    """

    def __init__(self) -> None:
        self.told_stop: list[bool] = []

    def __call__(self, args, setup, workdir, should_stop=None) -> TrialOutcome:
        ratio = 20.0 if "block-size" in args else 0.5 if "max-num-seqs" not in args else 2.0
        for step in (5, 10, 15, 20):
            if should_stop is not None and should_stop(step, ratio):
                self.told_stop.append(True)
                metrics = {"e2e_p99_s": ratio * 10.0, "stopped_at_s": float(step)}
                judged = score(metrics, Criteria(SLOS, WEIGHTS))
                return TrialOutcome(args, judged, metrics, {}, "far off", pruned=True)
        self.told_stop.append(False)
        metrics = {"e2e_p99_s": ratio * 10.0, "error_rate": 0.0}
        return TrialOutcome(args, score(metrics, Criteria(SLOS, WEIGHTS)), metrics, {})


def test_baseline_and_candidates_report_and_a_later_hopeless_trial_is_pruned(
    tmp_path: Path,
) -> None:
    spec = parse_spec(SPEC)
    storage = f"sqlite:///{tmp_path / 's.db'}"
    runner = Reporting()
    study = open_study("s", storage, 0, pruner_for(spec))
    run_study(study, spec, stand_in_setup(), tmp_path, 3, runner=runner)
    baseline, candidate, searched = optuna.load_study(study_name="s", storage=storage).trials
    assert baseline.user_attrs["baseline"] is True
    assert baseline.intermediate_values == {5: 0.5, 10: 0.5, 15: 0.5, 20: 0.5}
    assert baseline.state == TrialState.COMPLETE
    # The candidate is a reference point too: far off, yet measured in full, and recorded.
    assert candidate.user_attrs["candidate"] == 0
    assert candidate.intermediate_values == {5: 20.0, 10: 20.0, 15: 20.0, 20: 20.0}
    assert candidate.state == TrialState.COMPLETE
    names = [d.name for d in spec.space]
    assert ", the spec's candidate 0]" in trial_line(candidate, names)
    assert "candidate" not in trial_line(baseline, names) + trial_line(searched, names)
    # Searched: 2.0 is under the line of 3 x its SLO, but 4 times the baseline's at step 10.
    assert searched.state == TrialState.PRUNED
    assert searched.intermediate_values == {5: 2.0, 10: 2.0}
    assert runner.told_stop == [False, False, True]


@pytest.mark.parametrize("factor", [0.0, 5.0])
def test_no_trial_is_pruned_when_the_pruner_says_so(tmp_path: Path, factor: float) -> None:
    """With the pruner off (0), or a factor the searched trials stay within, all run in full."""
    spec = parse_spec(SPEC | {"prune_factor": factor})
    storage = f"sqlite:///{tmp_path / 's.db'}"
    runner = Reporting()
    run_study(
        open_study("s", storage, 0, pruner_for(spec)),
        spec,
        stand_in_setup(),
        tmp_path,
        3,
        runner=runner,
    )
    trials = optuna.load_study(study_name="s", storage=storage).trials
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 3
    assert runner.told_stop == [False, False, False]


# Storage failures: one line naming the storage and the cause, exit 1, no trial left RUNNING
# where the storage still takes a write.


@pytest.fixture
def inputs(tmp_path: Path, cpu_model: Path) -> Path:
    """A trace and a spec in ``tmp_path/elsewhere``, the working folder ``tmp_path`` bare."""
    folder = tmp_path / "elsewhere"
    folder.mkdir()
    spec = {**SPEC, "model": str(cpu_model), "engine_args": {"max-model-len": 4096}}
    write_spec(folder / "spec.yaml", spec)
    write_small_trace(folder / "trace.csv")
    return folder


def report_only(inputs: Path, *storage: str) -> subprocess.CompletedProcess[str]:
    """``tuner run --n-trials 0`` from ``inputs``' parent: opens the study, starts no vLLM."""
    return run_tuner(
        "run",
        "--trace",
        inputs / "trace.csv",
        "--study",
        "s",
        "--spec",
        inputs / "spec.yaml",
        *storage,
        "--n-trials",
        "0",
        cwd=inputs.parent,
        timeout_s=120,
    )


@pytest.mark.parametrize(
    ("url", "shown", "cause"),
    [
        ("nosuch://x", "nosuch://x", "Can't load plugin: sqlalchemy.dialects:nosuch"),
        ("not a url", "not a url", "Could not parse SQLAlchemy URL"),
        # No PostgreSQL listens on port 1; without its driver installed, that is the cause.
        ("postgresql://tuner@127.0.0.1:1/x", "postgresql://tuner@127.0.0.1:1/x", ""),
        ("postgresql://tuner:hunter2@127.0.0.1:1/x", "postgresql://tuner:***@127.0.0.1:1/x", ""),
    ],
    ids=["unknown-dialect", "not-a-url", "postgresql-unreachable", "password-hidden"],
)
def test_a_storage_that_cannot_be_opened_is_one_line_and_exit_1(
    inputs: Path, url: str, shown: str, cause: str
) -> None:
    result = report_only(inputs, "--storage", url)
    assert result.returncode == 1, result.stderr
    assert result.stderr.startswith(f"tuner: cannot open the study storage {shown}: {cause}")
    assert result.stderr.count("\n") == 1, result.stderr
    assert "hunter2" not in result.stderr + result.stdout


def test_sqlite_in_a_missing_folder_names_the_folder(inputs: Path) -> None:
    missing = inputs.parent / "nowhere"
    result = report_only(inputs, "--storage", f"sqlite:///{missing}/s.db")
    assert result.returncode == 1, result.stderr
    assert result.stderr == (
        f"tuner: cannot open the study storage sqlite:///{missing}/s.db: "
        f"unable to open database file (folder {missing} does not exist)\n"
    )
    assert not missing.exists()


def test_the_default_storage_makes_its_folder(inputs: Path) -> None:
    """With the spec elsewhere, nothing else makes ``studies/``; the default storage does."""
    result = report_only(inputs)
    # An empty study: nothing to write, exit 1, but the study is there.
    assert result.returncode == 1, result.stderr
    assert "no trial has finished its window" in result.stderr
    assert (inputs.parent / "studies" / "s.db").is_file()
    assert "study 's' in sqlite:///studies/s.db: 0 trials so far" in result.stdout


def quick_storage(path: Path, timeout_s: float) -> optuna.storages.RDBStorage:
    """A real SQLite storage that waits ``timeout_s`` for a lock instead of SQLite's 5 s."""
    return optuna.storages.RDBStorage(
        f"sqlite:///{path}", engine_kwargs={"connect_args": {"timeout": timeout_s}}
    )


def test_a_storage_locked_while_recording_marks_the_trial_failed(tmp_path: Path) -> None:
    """Another process holds the database for 3 s as the trial ends: recording what it
    measured gives up after 2 s, marking it FAIL (within 2 s more) goes through."""
    db = tmp_path / "s.db"
    study = open_study("s", quick_storage(db, timeout_s=2.0), 0)
    holder = sqlite3.connect(db, isolation_level=None, check_same_thread=False)

    def locked(args, setup, workdir, should_stop=None) -> TrialOutcome:
        holder.execute("BEGIN EXCLUSIVE")
        threading.Timer(3.0, holder.execute, ("ROLLBACK",)).start()
        return Reporting()(args, setup, workdir)

    try:
        with pytest.raises(TunerError) as raised:
            run_study(study, parse_spec(SPEC), stand_in_setup(), tmp_path, 2, runner=locked)
    finally:
        holder.close()
    assert str(raised.value) == (
        "trial 0: the study's storage failed: database is locked; the trial is marked FAIL"
    )
    (trial,) = optuna.load_study(study_name="s", storage=f"sqlite:///{db}").trials
    assert trial.state == TrialState.FAIL
    assert trial.user_attrs["reason"] == "the study's storage failed: database is locked"


def test_a_storage_locked_for_good_says_the_trial_stays_running(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    study = open_study("s", quick_storage(db, timeout_s=0.2), 0)
    holder = sqlite3.connect(db, isolation_level=None)

    def locked(args, setup, workdir, should_stop=None) -> TrialOutcome:
        holder.execute("BEGIN EXCLUSIVE")
        return Reporting()(args, setup, workdir)

    try:
        with pytest.raises(TunerError) as raised:
            run_study(study, parse_spec(SPEC), stand_in_setup(), tmp_path, 2, runner=locked)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert str(raised.value) == (
        "trial 0: the study's storage failed: database is locked; marking the trial FAIL "
        "failed too (database is locked): it stays RUNNING in the storage"
    )
    # What the message says is so.
    (trial,) = optuna.load_study(study_name="s", storage=f"sqlite:///{db}").trials
    assert trial.state == TrialState.RUNNING


def test_a_database_deleted_mid_run_says_the_trial_stays_running(tmp_path: Path) -> None:
    """The SQLite file removed while the trial ran: nothing can be written any more."""
    db = tmp_path / "s.db"
    study = open_study("s", f"sqlite:///{db}", 0)

    def deleting(args, setup, workdir, should_stop=None) -> TrialOutcome:
        db.unlink()
        return Reporting()(args, setup, workdir)

    with pytest.raises(TunerError) as raised:
        run_study(study, parse_spec(SPEC), stand_in_setup(), tmp_path, 2, runner=deleting)
    readonly = "attempt to write a readonly database"
    assert str(raised.value) == (
        f"trial 0: the study's storage failed: {readonly}; marking the trial FAIL failed too "
        f"({readonly}): it stays RUNNING in the storage"
    )


# The incumbent search through the study loop.

LANDSCAPE_SPEC = {
    **SPEC,
    "baseline": {},
    "candidates": [],
    "search_space": {
        "max-num-seqs": {"type": "int", "low": 1, "high": 32, "log": True, "default": 128},
        "max-num-batched-tokens": {"type": "categorical", "choices": [512, 2048, 8192],
                                   "default": 2048},
    },
    "prune_factor": 0,
}  # fmt: skip


def landscape_runner(seen: list[dict]):
    """Latency scores: best at max-num-seqs 8 and 8192 tokens; vLLM's defaults at 1.0."""

    def runner(args, setup, workdir, should_stop=None) -> TrialOutcome:
        seen.append(dict(args))
        seqs = args.get("max-num-seqs", 128)
        tokens = args.get("max-num-batched-tokens", 2048)
        ratio = 0.2 + 0.1 * abs(math.log2(seqs / 8)) + (0.0 if tokens == 8192 else 0.2)
        metrics = {"e2e_p99_s": ratio * 10.0, "error_rate": 0.0}
        return TrialOutcome(args, score(metrics, Criteria(SLOS, WEIGHTS)), metrics, {})

    return runner


def test_the_study_moves_from_vllms_defaults_with_the_incumbent(tmp_path: Path) -> None:
    spec = parse_spec(LANDSCAPE_SPEC)
    storage = f"sqlite:///{tmp_path / 's.db'}"
    seen: list[dict] = []
    run_study(
        open_study("s", storage, 0),
        spec,
        stand_in_setup(),
        tmp_path,
        8,
        runner=landscape_runner(seen),
    )
    trials = optuna.load_study(study_name="s", storage=storage).trials
    moves = [t.user_attrs.get("move") for t in trials]
    assert moves[0] is None and trials[0].user_attrs["baseline"] is True
    # vLLM's default 128 lies above the range: the search starts at its nearest level, 32.
    assert moves[1] == "the incumbent's levels"
    assert trials[1].params == {"max-num-seqs": 32, "max-num-batched-tokens": 2048}
    assert moves[2] == "max-num-seqs down 1" and trials[2].params["max-num-seqs"] == 16
    assert all(isinstance(m, str) for m in moves[1:])
    points = [tuple(sorted(t.params.items())) for t in trials[1:]]
    assert len(points) == len(set(points))
    best = min(trials, key=lambda t: t.value or 0.0)
    assert best.params == {"max-num-seqs": 8, "max-num-batched-tokens": 8192}
    assert len(seen) == 8


@pytest.mark.parametrize(("budget_s", "ran"), [(-1.0, 1), (3600.0, 3)])
def test_a_time_budget_ends_the_trials_but_never_before_the_first(
    tmp_path: Path, budget_s: float, ran: int
) -> None:
    # A budget spent before the first trial (a slow machine's calibration took it all): the
    # baseline still runs, so the run has an answer; no other trial starts.
    storage = f"sqlite:///{tmp_path / 's.db'}"
    seen: list[dict] = []
    done = run_study(
        open_study("s", storage, 0),
        parse_spec(LANDSCAPE_SPEC),
        stand_in_setup(),
        tmp_path,
        3,
        runner=landscape_runner(seen),
        budget=Budget(ends=time.monotonic() + budget_s, confirm_trials=0, estimate_s=0.0),
    )
    assert done == ran and len(seen) == ran
    trials = optuna.load_study(study_name="s", storage=storage).trials
    assert trials[0].user_attrs["baseline"] is True


def test_the_budget_learns_when_the_study_holds_a_contender(tmp_path: Path) -> None:
    # Until a configuration besides the defaults served, the search leaves room for only the
    # confirmation's first turn (``Budget.contender``); the trial that serves ends that.
    storage = f"sqlite:///{tmp_path / 's.db'}"
    budget = Budget(
        ends=time.monotonic() + 3600.0, confirm_trials=4, estimate_s=0.0, contender=False
    )
    spec, study = parse_spec(LANDSCAPE_SPEC), open_study("s", storage, 0)
    run_study(
        study, spec, stand_in_setup(), tmp_path, 1, runner=landscape_runner([]), budget=budget
    )
    assert not budget.contender  # the baseline alone
    run_study(
        study, spec, stand_in_setup(), tmp_path, 1, runner=landscape_runner([]), budget=budget
    )
    assert budget.contender and not study.trials[1].user_attrs.get("baseline")


def test_tpe_draws_when_the_spec_asks(tmp_path: Path) -> None:
    spec = parse_spec(LANDSCAPE_SPEC | {"search": "tpe"})
    storage = f"sqlite:///{tmp_path / 's.db'}"
    run_study(
        open_study("s", storage, 0),
        spec,
        stand_in_setup(),
        tmp_path,
        3,
        runner=landscape_runner([]),
    )
    trials = optuna.load_study(study_name="s", storage=storage).trials
    assert all("move" not in t.user_attrs for t in trials)


def test_a_gated_capacity_trial_is_pruned_and_says_so(tmp_path: Path) -> None:
    spec = parse_spec(LANDSCAPE_SPEC | {"objective_mode": "capacity"})
    storage = f"sqlite:///{tmp_path / 's.db'}"
    gates: list[float | None] = []

    def runner(args, setup, workdir, should_stop=None) -> TrialOutcome:
        gate = setup.measure.settings.gate_req_per_s
        gates.append(gate)
        if gate is None:
            metrics = {CAPACITY_ATTR: 6.0}
            points = ({"rate_req_per_s": 6.0, "passed": True},)
            return TrialOutcome(args, capacity_score(6.0), metrics, {}, points=points)
        metrics = {BELOW_ATTR: gate, "ttft_p95_s": 3.0}
        return TrialOutcome(args, capacity_score(0.0), metrics, {}, "failed at 6", pruned=True)

    settings = CapacitySettings(requests=(), period_s=1.0, probe_s=5.0)
    setup = replace(stand_in_setup(), measure=RateSearch(settings))
    study = open_study("s", storage, 0, objective=CAPACITY_OBJECTIVE)
    run_study(study, spec, setup, tmp_path, 2, runner=runner)
    baseline, searched = optuna.load_study(study_name="s", storage=storage).trials
    # Gated one resolution step (10%) above the baseline's capacity.
    assert baseline.user_attrs[CAPACITY_ATTR] == 6.0 and gates == [None, pytest.approx(6.6)]
    assert searched.state == TrialState.PRUNED
    assert searched.user_attrs[BELOW_ATTR] == pytest.approx(6.6)
    line = trial_line(searched, [d.name for d in spec.space])
    assert "[pruned, the incumbent's levels]" in line and "capacity below 6.6 req/s" in line
