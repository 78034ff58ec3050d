"""Numeric options: checked as they are parsed, and an override is never dropped.

Each run goes through ``tuner.cli.main`` with ``--n-trials 0`` (or fails before it), so no vLLM
starts; a study in SQLite is opened only where the options are good. ``tuner trace inspect``'s
service model and window are checked alike (``from-prometheus``'s in test_from_prometheus).
"""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from conftest import write_small_trace, write_spec

from tuner.cli.exits import EXIT_BAD_INPUT, EXIT_FAILED
from tuner.cli.main import main
from tuner.cli.parser import build_parser
from tuner.cli.run import launcher_for
from tuner.engine.launchers import LAUNCHERS, ProcessLauncher, ZygoteLauncher, auto_launcher

SPEC = {
    "dummy_model": None,
    "engine_args": {"load-format": "dummy", "max-model-len": 4096},
    "search_space": {"max-num-seqs": {"type": "int", "low": 1, "high": 32}},
    "slos": {"ttft_p95_s": 2.0},
    "weights": {"ttft_p95_s": 1.0},
    "window_s": 5,
    "time_scale": 1,
}


@pytest.fixture
def folder(tmp_path: Path, cpu_model: Path) -> Path:
    write_spec(tmp_path / "spec.yaml", {"model": str(cpu_model), **SPEC})
    write_small_trace(tmp_path / "trace.csv")
    return tmp_path


def run(folder: Path, *options: str) -> int:
    return main(
        [
            "run",
            "--trace",
            str(folder / "trace.csv"),
            "--study",
            "s",
            "--spec",
            str(folder / "spec.yaml"),
            "--storage",
            f"sqlite:///{folder / 's.db'}",
            "--configs",
            str(folder / "configs"),
            "--runs",
            str(folder / "runs"),
            *options,
        ]
    )


@pytest.mark.parametrize(
    ("option", "value", "said"),
    [
        ("--window-s", "0", "must be a positive number, got '0'"),
        ("--window-s", "-5", "must be a positive number, got '-5'"),
        ("--window-s", "nan", "must be a positive number, got 'nan'"),
        ("--window-s", "inf", "must be a positive number, got 'inf'"),
        ("--window-s", "ten", "must be a positive number, got 'ten'"),
        ("--time-scale", "0", "must be a positive number, got '0'"),
        ("--time-scale", "-0.5", "must be a positive number, got '-0.5'"),
        ("--time-budget-s", "0", "must be a positive number, got '0'"),
        ("--time-budget-s", "-60", "must be a positive number, got '-60'"),
        ("--n-trials", "-1", "must be a whole number >= 0, got '-1'"),
        ("--n-trials", "1.5", "must be a whole number >= 0, got '1.5'"),
    ],
)
def test_a_bad_number_exits_2_as_it_is_parsed(
    folder: Path, capsys, option: str, value: str, said: str
) -> None:
    options = [option, value] if option == "--n-trials" else ["--n-trials", "0", option, value]
    with pytest.raises(SystemExit) as exited:
        run(folder, *options)
    assert exited.value.code == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert f"tuner run: error: argument {option}: {said}" in err.splitlines()
    assert "Traceback" not in err
    # Refused before anything is opened or written.
    assert sorted(p.name for p in folder.iterdir()) == ["spec.yaml", "trace.csv"]


def test_good_numbers_override_the_spec(folder: Path, capsys) -> None:
    options = ["--window-s", "2.5", "--time-scale", "0.5", "--time-budget-s", "30"]
    # Nothing measured yet: no trial served, exit 1, but the study was opened with the overrides.
    assert run(folder, "--n-trials", "0", *options) == EXIT_FAILED
    out = capsys.readouterr().out
    assert "adding 0" in out
    fingerprint = optuna.load_study(study_name="s", storage=f"sqlite:///{folder / 's.db'}")
    recorded = fingerprint.user_attrs["workload"]
    assert (recorded["window_s"], recorded["time_scale"]) == (2.5, 0.5)


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("--window-s", "nan"),
        ("--window-s", "0"),
        ("--window-s", "-60"),
        ("--window-s", "inf"),
        ("--tpot-ms", "nan"),
        ("--tpot-ms", "-30"),
        ("--prefill-tokens-per-s", "0"),
        ("--prefill-tokens-per-s", "-inf"),
        ("--prefill-tokens-per-s", "fast"),
    ],
)
def test_trace_inspect_refuses_a_bad_number_as_it_is_parsed(
    tmp_path: Path, capsys, option: str, value: str
) -> None:
    trace = write_small_trace(tmp_path / "trace.csv")
    with pytest.raises(SystemExit) as exited:
        main(["trace", "inspect", str(trace), "--no-png", f"{option}={value}"])
    assert exited.value.code == EXIT_BAD_INPUT
    captured = capsys.readouterr()
    said = f"must be a positive number, got {value!r}"
    assert f"tuner trace inspect: error: argument {option}: {said}" in captured.err.splitlines()
    assert captured.out == "" and "Traceback" not in captured.err


def test_trace_inspect_takes_a_fractional_window(tmp_path: Path, capsys) -> None:
    trace = write_small_trace(tmp_path / "trace.csv")
    assert main(["trace", "inspect", str(trace), "--no-png", "--window-s", "2.5"]) == 0
    busiest = [line for line in capsys.readouterr().out.splitlines() if "busiest" in line]
    assert busiest == [
        "busiest window     2.5 s from 0.0 s: 10 requests (4.00 req/s), what tuner run replays"
    ]


@pytest.mark.parametrize("cpu_build", [True, False])
def test_each_launcher_is_offered_by_name_and_auto_picks_one_of_them(cpu_build, tmp_path, capsys):
    """``--launcher`` takes auto (the default) and every launcher of the registry, nothing
    else; auto is the process launcher on vLLM's CPU build, the zygote elsewhere."""
    parser = build_parser()
    assert parser.parse_args(["run", "--trace", "t.csv"]).launcher == "auto"
    for name in LAUNCHERS:
        assert parser.parse_args(["run", "--trace", "t.csv", "--launcher", name]).launcher == name
    with pytest.raises(SystemExit):
        parser.parse_args(["run", "--trace", "t.csv", "--launcher", "thread"])
    assert auto_launcher(cpu_build) == ("process" if cpu_build else "zygote")
    for name, kind in (("process", ProcessLauncher), ("zygote", ZygoteLauncher)):
        launcher = launcher_for(name, tmp_path / "launcher.log")
        try:
            assert isinstance(launcher, kind)
        finally:
            launcher.close()
    assert capsys.readouterr().out.splitlines() == ["launcher: process", "launcher: zygote"]
