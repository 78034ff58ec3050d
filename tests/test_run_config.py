"""The run's configuration, resolved once from ``tuner run``'s command line and the spec: the
command line beats the spec for each option both can set, the spec's value stands where the
command line is silent, and the spec's defaults where both are. Built as ``tuner run`` builds
it (``load_study_spec``, then ``tuner.cli.run.run_config``), with no engine and no study."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import write_small_trace, write_spec

from tuner.cli.parser import build_parser
from tuner.cli.run import run_config
from tuner.cli.spec import load_study_spec
from tuner.study.plan.spec import AUTO, DEFAULT_SPEC, StudySpec
from tuner.study.result.run_config import RunConfig
from tuner.study.setup.calibrate import Calibration, TimeScale
from tuner.study.setup.objective import CAPACITY_OBJECTIVE, LATENCY_OBJECTIVE, of_spec

# A spec that sets every value the command line can set too.
SPEC = {
    "dummy_model": None,
    "engine_args": {"load-format": "dummy"},
    "slos": {"ttft_p95_s": 2.0},
    "weights": {"ttft_p95_s": 1.0},
    "max_error_rate": 0.2,
    "objective_mode": "latency",
    "n_trials": 7,
    "time_budget_s": 900,
    "window_s": 30,
    "time_scale": "auto",
    "seed": 11,
}

# Each option both can set, with the value the command line gives.
GIVEN = [
    "--n-trials", "3",
    "--time-budget-s", "60",
    "--window-s", "5",
    "--time-scale", "0.5",
    "--slo", "e2e_p99_s=9",
    "--objective", "capacity",
]  # fmt: skip


def resolved(tmp_path: Path, spec: dict[str, Any], *options: str) -> tuple[RunConfig, StudySpec]:
    """The spec and the run's configuration of ``tuner run --study s --spec ... OPTIONS``."""
    path = write_spec(tmp_path / "spec.yaml", spec)
    trace = write_small_trace(tmp_path / "trace.csv")
    args = build_parser().parse_args(
        ["run", "--trace", str(trace), "--study", "s", "--spec", str(path), *options]
    )
    study_spec = load_study_spec(args, "s", None)
    return run_config(args, "s", study_spec, began=100.0), study_spec


def test_the_command_line_beats_the_spec(tmp_path, cpu_model):
    options = [*GIVEN, "--storage", "sqlite:///x.db", "--launcher", "process"]
    options += ["--runs", str(tmp_path / "r"), "--configs", str(tmp_path / "c")]
    config, spec = resolved(tmp_path, {"model": str(cpu_model), **SPEC}, *options)
    assert (config.n_trials, config.time_budget_s, config.budget_given) == (3, 60.0, True)
    assert config.window_s == 5.0
    assert config.time_scale.given == 0.5 and config.time_scale.factor() == 0.5
    assert not config.time_scale.calibrates(LATENCY_OBJECTIVE, request_trace=True)
    assert (config.storage, config.launcher) == ("sqlite:///x.db", "process")
    assert config.run_dir == tmp_path / "r" / "s"
    assert config.config_path == tmp_path / "c" / "s.yaml"
    # --slo replaces the spec's SLOs, each weighted 1; the spec's max_error_rate is kept.
    assert dict(config.criteria.slos) == {"e2e_p99_s": 9.0}
    assert dict(config.criteria.weights) == {"e2e_p99_s": 1.0}
    assert config.criteria.max_error_rate == 0.2
    assert spec.objective_mode == "capacity" and config.seed == 11
    assert config.began == 100.0 and config.measures


def test_the_spec_stands_where_the_command_line_is_silent(tmp_path, cpu_model):
    config, spec = resolved(tmp_path, {"model": str(cpu_model), **SPEC})
    assert (config.n_trials, config.time_budget_s, config.budget_given) == (7, 900.0, False)
    assert config.window_s == 30.0
    assert config.time_scale.given == AUTO and config.time_scale.factor() == 1.0
    assert config.time_scale.calibrates(of_spec(spec), request_trace=True)
    assert not config.time_scale.calibrates(of_spec(spec), request_trace=False)
    assert (config.storage, config.launcher) == ("sqlite:///studies/s.db", "auto")
    assert config.run_dir == Path("runs") / "s"
    assert config.config_path == Path("configs") / "s.yaml"
    assert dict(config.criteria.slos) == {"ttft_p95_s": 2.0}
    assert config.criteria.max_error_rate == 0.2
    assert spec.objective_mode == "latency" and config.seed == 11


def test_the_defaults_stand_where_both_are_silent(tmp_path, cpu_model):
    config, spec = resolved(tmp_path, {"model": str(cpu_model), "dummy_model": None})
    assert config.n_trials == DEFAULT_SPEC["n_trials"]
    assert config.time_budget_s == DEFAULT_SPEC["time_budget_s"] and not config.budget_given
    assert config.window_s == DEFAULT_SPEC["window_s"]
    assert config.time_scale.given == DEFAULT_SPEC["time_scale"]
    assert dict(config.criteria.slos) == DEFAULT_SPEC["slos"]
    assert dict(config.criteria.weights) == DEFAULT_SPEC["weights"]
    assert config.criteria.max_error_rate == DEFAULT_SPEC["max_error_rate"]
    assert spec.objective_mode == DEFAULT_SPEC["objective_mode"]
    assert config.seed == DEFAULT_SPEC["seed"]


@pytest.mark.parametrize("n_trials", [[], ["--n-trials", "5"]])
def test_confirm_only_adds_no_trial_and_still_measures(tmp_path, cpu_model, n_trials):
    spec = {"model": str(cpu_model), **SPEC}
    config, _ = resolved(tmp_path, spec, "--confirm-only", *n_trials)
    assert config.n_trials == 0 and config.confirm_only and config.measures
    config, _ = resolved(tmp_path, spec, "--n-trials", "0")
    assert config.n_trials == 0 and not config.measures


def test_the_time_scale_says_whether_a_run_calibrates_and_the_factor_after():
    # The window's 4 req/s replayed at half the 10 req/s the defaults carried: time scale 0.8.
    found = Calibration(10.0, 5.0, 0.5, 4.0, 3.0, 3, 20.0)
    auto, given = TimeScale(AUTO), TimeScale(2.0)
    assert auto.factor() == 1.0 and auto.factor(found) == pytest.approx(0.8)
    assert given.factor() == given.factor(found) == 2.0
    assert auto.calibrates(LATENCY_OBJECTIVE, request_trace=True)
    assert not auto.calibrates(CAPACITY_OBJECTIVE, request_trace=True)
    assert not given.calibrates(LATENCY_OBJECTIVE, request_trace=True)
