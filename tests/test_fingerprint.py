"""A study's fingerprint: trials scored another way, or on another vLLM or device, are refused.

And the configuration written names the vLLM version and device its trial was measured on, not
those of the machine that writes it. Studies in real SQLite files, filled by ``run_study`` with
a stand-in runner (the ``runner`` seam) or by Optuna's own ``add_trial``; ``tuner run
--n-trials 0`` (through ``tuner.cli.main``) checks and reports, as after a real run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml
from conftest import write_small_trace, write_spec
from optuna.distributions import IntDistribution
from optuna.trial import TrialState, create_trial

from tuner import build
from tuner.cli.exits import EXIT_BAD_INPUT, EXIT_MISSES_SLOS, MEETS_SLOS_EXITS
from tuner.cli.main import main
from tuner.engine import environment
from tuner.load.http import ReplaySettings
from tuner.study.measure.scoring import score
from tuner.study.measure.trial import Criteria, TrialOutcome, TrialSetup
from tuner.study.plan.spec import parse_spec
from tuner.study.trials.fingerprint import differences
from tuner.study.trials.search import open_study, run_study

STUDY = "s"
NEW_STUDY_HINT = "use --study NEWNAME (or delete the DB) to start a new study"
MEASURED_ON = {"vllm_version": "0.0.1-measured", "device": "Measured GPU 80GB"}


class Folder:
    """A trace, a spec and a study's SQLite file; ``tuner run`` on them."""

    def __init__(self, root: Path, model: Path) -> None:
        self.root = root
        self.spec: dict[str, Any] = {
            "model": str(model),
            "dummy_model": None,
            "engine_args": {"load-format": "dummy", "max-model-len": 4096},
            "search_space": {"max-num-seqs": {"type": "int", "low": 1, "high": 32}},
            "slos": {"ttft_p95_s": 2.0, "e2e_p99_s": 30.0},
            "weights": {"ttft_p95_s": 1.0, "e2e_p99_s": 1.0},
            "window_s": 5,
            "time_scale": 1,
        }
        self.write_spec()
        write_small_trace(root / "trace.csv")
        self.storage = f"sqlite:///{root / 'study.db'}"

    def write_spec(self) -> None:
        write_spec(self.root / "spec.yaml", self.spec)

    def tuner_run(self, n_trials: int = 0) -> int:
        return main(
            [
                "run",
                "--trace",
                str(self.root / "trace.csv"),
                "--study",
                STUDY,
                "--spec",
                str(self.root / "spec.yaml"),
                "--storage",
                self.storage,
                "--n-trials",
                str(n_trials),
                "--configs",
                str(self.root / "configs"),
                "--runs",
                str(self.root / "runs"),
            ]
        )

    def fill(self, n_trials: int, measured_on: dict[str, str] | None = None) -> None:
        """``n_trials`` trials that meet the SLOs, measured by a stand-in runner."""
        spec = parse_spec(self.spec)

        def runner(args, setup, workdir, should_stop=None) -> TrialOutcome:
            metrics = {"ttft_p95_s": 0.5, "e2e_p99_s": 8.0, "error_rate": 0.0}
            return TrialOutcome(args, score(metrics, Criteria.of(spec)), metrics, {})

        setup = TrialSetup(
            model=spec.model,
            requests=(),
            replay=ReplaySettings(model="m", vocab_size=100),
            criteria=Criteria(spec.slos, spec.weights),
        )
        study = open_study(STUDY, self.storage, 0)
        run_study(
            study, spec, setup, self.root / "runs", n_trials, runner=runner, measured_on=measured_on
        )

    def study(self) -> optuna.Study:
        return optuna.load_study(study_name=STUDY, storage=self.storage)

    @property
    def header(self) -> list[str]:
        text = (self.root / "configs" / f"{STUDY}.yaml").read_text()
        return [line for line in text.splitlines() if line.startswith("#")]


@pytest.fixture
def folder(tmp_path: Path, cpu_model: Path) -> Folder:
    return Folder(tmp_path, cpu_model)


def test_a_resumed_study_with_other_slos_is_refused_naming_them(folder: Folder, capsys) -> None:
    assert folder.tuner_run() != EXIT_BAD_INPUT  # creates the study and its fingerprint
    folder.fill(2, MEASURED_ON)
    assert folder.tuner_run() in MEETS_SLOS_EXITS  # the same spec: accepted
    capsys.readouterr()

    folder.spec["slos"] = {"ttft_p95_s": 1.0, "e2e_p99_s": 30.0}
    folder.write_spec()
    assert folder.tuner_run() == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith(f"tuner: study '{STUDY}' was measured another way (")
    assert "slos.ttft_p95_s: 2.0 -> 1.0" in err
    assert NEW_STUDY_HINT in err
    assert len(folder.study().trials) == 2


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"weights": {"ttft_p95_s": 2.0, "e2e_p99_s": 1.0}}, "weights.ttft_p95_s: 1.0 -> 2.0"),
        (
            {"search_space": {"max-num-seqs": {"type": "int", "low": 1, "high": 64}}},
            "search_space.max-num-seqs: ",
        ),
        (
            {"engine_args": {"load-format": "dummy", "max-model-len": 2048}},
            "engine_args.max-model-len: 4096 -> 2048",
        ),
        ({"max_error_rate": 0.1}, "max_error_rate: 0.0 -> 0.1"),
        ({"window_s": 4}, "window_s: 5.0 -> 4.0"),
    ],
    ids=["weights", "search-space", "engine-args", "error-budget", "window"],
)
def test_each_part_of_the_fingerprint_is_checked(
    folder: Folder, capsys, change: dict[str, Any], named: str
) -> None:
    folder.tuner_run()
    folder.spec |= change
    folder.write_spec()
    assert folder.tuner_run() == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert named in err and NEW_STUDY_HINT in err


def test_another_model_is_refused(folder: Folder, capsys, tmp_path: Path) -> None:
    folder.tuner_run()
    before = folder.spec["model"]
    other = tmp_path / "other-model"
    other.mkdir()
    (other / "config.json").write_text((Path(folder.spec["model"]) / "config.json").read_text())
    folder.spec["model"] = str(other)
    folder.write_spec()
    assert folder.tuner_run() == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert f"model: '{before}' -> '{other}'" in err


def with_fingerprint(folder: Folder, **fields: Any) -> None:
    """Give the study the fingerprint a run with the current spec records, changed by ``fields``
    (None: left out)."""
    folder.tuner_run()
    study = folder.study()
    recorded = {**study.user_attrs["workload"], **fields}
    study.set_user_attr("workload", {k: v for k, v in recorded.items() if v is not None})


def test_adding_trials_on_another_vllm_or_device_is_refused(folder: Folder, capsys) -> None:
    with_fingerprint(folder, **MEASURED_ON)
    capsys.readouterr()
    # Refused before any trial starts: no vLLM is started here.
    assert folder.tuner_run(n_trials=1) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert f"vllm_version: '0.0.1-measured' -> '{environment.vllm_version()}'" in err
    assert "device: 'Measured GPU 80GB' -> " in err
    assert NEW_STUDY_HINT in err
    assert folder.study().trials == []


def test_reporting_from_another_machine_is_not_refused(folder: Folder, capsys) -> None:
    with_fingerprint(folder, **MEASURED_ON)
    folder.fill(1, MEASURED_ON)
    assert folder.tuner_run(n_trials=0) in MEETS_SLOS_EXITS


def test_an_old_study_is_checked_on_what_it_recorded_then_on_everything(
    folder: Folder, capsys
) -> None:
    """A study recorded before the fingerprint covered the spec: compared on its own keys
    (trace, window, time scale), completed with the rest, and from then on checked on all."""
    old_keys = {"slos": None, "weights": None, "search_space": None, "engine_args": None}
    with_fingerprint(folder, model=None, max_error_rate=None, **old_keys)
    folder.fill(1)
    capsys.readouterr()
    assert folder.tuner_run() in MEETS_SLOS_EXITS
    out = capsys.readouterr().out
    assert f"study '{STUDY}' predates tuner checking " in out
    assert "engine_args, max_error_rate, model, search_space, slos, weights" in out
    assert set(folder.study().user_attrs["workload"]) >= {"slos", "model", "search_space"}
    folder.spec["slos"] = {"ttft_p95_s": 1.0, "e2e_p99_s": 30.0}
    folder.write_spec()
    assert folder.tuner_run() == EXIT_BAD_INPUT
    assert "slos.ttft_p95_s: 2.0 -> 1.0" in capsys.readouterr().err


def test_an_old_study_of_another_window_is_refused(folder: Folder, capsys) -> None:
    with_fingerprint(folder, window_s=10.0, slos=None, model=None)
    assert folder.tuner_run() == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "window_s: 10.0 -> 5.0" in err and "slos" not in err


def test_each_trial_records_its_vllm_version_and_device(folder: Folder) -> None:
    folder.fill(2, MEASURED_ON)
    folder.fill(1)  # by default, this machine's
    first, second, third = folder.study().trials
    assert {k: first.user_attrs[k] for k in MEASURED_ON} == MEASURED_ON
    assert {k: second.user_attrs[k] for k in MEASURED_ON} == MEASURED_ON
    assert third.user_attrs["vllm_version"] == environment.vllm_version()
    assert third.user_attrs["device"] == environment.device_name()


def measured(attrs: dict[str, Any]) -> optuna.trial.FrozenTrial:
    """A trial that met the SLOs, as ``run_study`` records one."""
    return create_trial(
        state=TrialState.COMPLETE,
        value=0.5,
        params={"max-num-seqs": 8},
        distributions={"max-num-seqs": IntDistribution(1, 32)},
        user_attrs={
            "engine_args": {"load-format": "dummy", "max-num-seqs": 8},
            "feasible": True,
            "ttft_p95_s": 0.5,
            "e2e_p99_s": 9.0,
            "error_rate": 0.0,
            **attrs,
        },
        constraints={"slo_ttft_p95_s": -0.75, "slo_e2e_p99_s": -0.7, "error_rate": 0.0},
    )


def test_the_header_names_the_vllm_and_device_the_trial_was_measured_on(folder: Folder) -> None:
    folder.tuner_run()
    folder.study().add_trial(measured(MEASURED_ON))
    # A searched trial with no baseline beside it: written, unconfirmed.
    assert folder.tuner_run() == EXIT_MISSES_SLOS
    assert f"# Tuned by tuner {build.describe()} for vLLM 0.0.1-measured on Measured GPU 80GB." in (
        folder.header
    )
    body = yaml.safe_load((folder.root / "configs" / f"{STUDY}.yaml").read_text())
    assert body["max-num-seqs"] == 8


def test_a_trial_recorded_without_them_says_whose_they_are(folder: Folder) -> None:
    folder.tuner_run()
    folder.study().add_trial(measured({}))
    assert folder.tuner_run() == EXIT_MISSES_SLOS  # unconfirmed, as above
    here = f"for vLLM {environment.vllm_version()} on {environment.device_name()}."
    assert f"# Tuned by tuner {build.describe()} {here}" in folder.header
    assert (
        "# (trial 0 recorded no vLLM version or device: those are of the machine that wrote "
        "this file)" in folder.header
    )


def test_differences_name_each_key_and_field() -> None:
    recorded = {"slos": {"a": 1.0, "b": 2.0}, "model": "m", "window_s": 5.0, "old": 1}
    current = {"slos": {"a": 1.0, "b": 3.0, "c": 1.0}, "model": "n", "window_s": 5.0, "new": 2}
    assert differences(recorded, current) == [
        "slos.b: 2.0 -> 3.0",
        "slos.c: absent -> 1.0",
        "model: 'm' -> 'n'",
    ]
