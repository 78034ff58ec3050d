"""What ``tuner run`` writes and how it exits: meets the SLOs (0), closest but misses them (3),
nothing served (1).

Each study is a real Optuna study in SQLite, filled by ``run_study`` with a stand-in trial
runner (the ``runner`` seam) whose outcomes are scripted; then ``tuner run --n-trials 0``
reports on it through ``tuner.cli.main``, as after a real run.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
import yaml
from conftest import write_small_trace, write_spec
from optuna.trial import TrialState

from tuner.cli.exits import EXIT_FAILED, EXIT_MEETS_SLOS, EXIT_MISSES_SLOS
from tuner.cli.main import main
from tuner.load.http import ReplaySettings
from tuner.study.emit import served_config
from tuner.study.outcome import Offered, next_steps
from tuner.study.scoring import FAILED, score
from tuner.study.search import open_study, pruner_for, run_study
from tuner.study.spec import parse_spec
from tuner.study.trial import Objective, TrialOutcome, TrialSetup
from tuner.traces.formats import load_trace
from tuner.traces.workload import build_workload

STUDY = "s"


def spec_dict(model: Path) -> dict:
    return {
        "model": str(model),
        "dummy_model": None,
        "engine_args": {"load-format": "dummy", "max-model-len": 4096},
        "baseline": {},
        "search_space": {"max-num-seqs": {"type": "int", "low": 1, "high": 32}},
        # A 1 ms TTFT SLO: every trial that serves misses it by far (scores in the thousands,
        # above the 1000 that a failed trial is scored).
        "slos": {"ttft_p95_s": 0.001, "e2e_p99_s": 30.0},
        "objective": {"ttft_p95_s": 1.0, "e2e_p99_s": 1.0},
        "window_s": 5,
        "time_scale": 1,
    }


def measured(ttft_p95_s: float, error_rate: float = 0.0) -> dict[str, float]:
    return {
        "ttft_p95_s": ttft_p95_s,
        "e2e_p99_s": 8.0,
        "error_rate": error_rate,
        "requests": 20.0,
        "throughput_req_per_s": 0.9,
        "waiting_peak": 7.0,
    }


class Study:
    """A study of scripted outcomes, and ``tuner run --n-trials 0`` on it."""

    def __init__(self, folder: Path, model: Path) -> None:
        self.folder = folder
        self.storage = f"sqlite:///{folder / 'study.db'}"
        self.spec_path = write_spec(folder / "spec.yaml", spec_dict(model))
        self.spec = parse_spec(spec_dict(model))
        self.trace = folder / "trace.csv"
        write_small_trace(self.trace)
        self.configs = folder / "configs"
        self.args: list[dict] = []

    def fill(self, outcomes: list[TrialOutcome | str]) -> None:
        """Run one trial per outcome: an outcome as scripted, or "pruned" (stopped early)."""
        script: Iterator[TrialOutcome | str] = iter(outcomes)
        objective = Objective(self.spec.slos, self.spec.weights, self.spec.max_error_rate)

        def runner(args, setup, workdir, should_stop=None) -> TrialOutcome:
            self.args.append(dict(args))
            scripted = next(script)
            if scripted == "pruned":
                assert should_stop is not None
                should_stop(1, 0.5)  # reported: Optuna keeps it as the pruned trial's value
                metrics = {"ttft_p95_s": 0.002, "e2e_p99_s": 1.0}
                judged = score(metrics, objective.slos, objective.weights)
                return TrialOutcome(args, judged, metrics, {}, "stopped early", pruned=True)
            assert isinstance(scripted, TrialOutcome)
            return TrialOutcome(args, scripted.score, scripted.metrics, {}, scripted.reason)

        setup = TrialSetup(
            model=self.spec.model,
            requests=(),
            replay=ReplaySettings(model="m", vocab_size=100),
            objective=objective,
        )
        study = open_study(STUDY, self.storage, 0, pruner_for(self.spec))
        run_study(study, self.spec, setup, self.folder / "runs", len(outcomes), runner=runner)

    def served(self, metrics: dict[str, float]) -> TrialOutcome:
        judged = score(metrics, self.spec.slos, self.spec.weights, self.spec.max_error_rate)
        return TrialOutcome({}, judged, metrics, {})

    def report(self) -> int:
        return main(
            [
                "run",
                "--trace",
                str(self.trace),
                "--study",
                STUDY,
                "--spec",
                str(self.spec_path),
                "--storage",
                self.storage,
                "--n-trials",
                "0",
                "--configs",
                str(self.configs),
                "--runs",
                str(self.folder / "runs"),
            ]
        )

    @property
    def config(self) -> Path:
        return self.configs / f"{STUDY}.yaml"


@pytest.fixture
def study(tmp_path: Path, cpu_model: Path) -> Study:
    return Study(tmp_path, cpu_model)


def test_no_trial_meets_the_slos_writes_the_closest_and_exits_3(study: Study, capsys) -> None:
    study.fill(
        [
            study.served(measured(4.561)),  # the baseline: score about 4562
            # An engine that failed: scored 1000, lower, but it served nothing.
            TrialOutcome({}, FAILED, {}, {}, "vLLM exited with status 1 before it was healthy"),
            study.served(measured(3.0)),  # the closest: score about 3001
            "pruned",  # stopped early, lower still: not a candidate
            study.served(measured(3.5)),
        ]
    )
    assert study.report() == EXIT_MISSES_SLOS
    out = capsys.readouterr().out
    text = study.config.read_text()
    lines = text.splitlines()
    assert lines[:3] == [
        "# meets SLOs: no",
        "#   ttft_p95_s: 3000 ms (SLO 1 ms)",
        "# Tuned by tuner 0.1.0 for vLLM " + lines[2].split("for vLLM ", 1)[1],
    ]
    assert "# Study 's', trial 2." in lines
    pruned = optuna.load_study(study_name=STUDY, storage=study.storage).trials[3]
    assert pruned.state == TrialState.PRUNED and pruned.value == 0.5
    # The body is exactly the closest trial's engine arguments.
    assert text.endswith(served_config(study.spec.model, study.args[2]))
    assert yaml.safe_load(text) == {"model": study.spec.model, **study.args[2]}

    assert f"no trial met the SLOs; wrote the closest, trial 2, to {study.config}" in out
    assert "  meets SLOs: no\n    ttft_p95_s: 3000 ms (SLO 1 ms)\n" in out
    assert f"relax the SLOs in {study.spec_path}" in out
    offered = build_workload(load_trace(study.trace), 5, 1, 4096).offered_req_per_s
    assert f"the window offers {offered:.2f} req/s" in out
    assert "trial 2 completed 0.90 req/s" in out
    assert f"roughly {math.ceil(offered / 0.9)} servers like trial 2" in out
    assert "vLLM's waiting queue peaked at 7" in out


def test_error_rate_missed_is_named_too(study: Study, capsys) -> None:
    study.fill([study.served(measured(2.0, error_rate=0.25))])
    assert study.report() == EXIT_MISSES_SLOS
    lines = study.config.read_text().splitlines()
    assert lines[:3] == [
        "# meets SLOs: no",
        "#   ttft_p95_s: 2000 ms (SLO 1 ms)",
        "#   error_rate: 25.0% (SLO 0.0%)",
    ]


def test_a_trial_that_meets_the_slos_wins_and_exits_0(study: Study, capsys) -> None:
    study.fill(
        [
            study.served(measured(4.561)),
            study.served(measured(0.0005)),  # meets the SLOs
            study.served(measured(0.0001, error_rate=0.5)),  # lower score, but errors
        ]
    )
    assert study.report() == EXIT_MEETS_SLOS
    text = study.config.read_text()
    assert text.startswith("# meets SLOs: yes\n# Tuned by tuner ")
    assert "# Study 's', trial 1." in text.splitlines()
    assert text.endswith(served_config(study.spec.model, study.args[1]))
    out = capsys.readouterr().out
    assert f"best: trial 1; wrote {study.config}" in out
    assert "no trial met" not in out


def test_no_trial_served_writes_nothing_and_exits_1(study: Study, capsys) -> None:
    first = TrialOutcome({}, FAILED, {}, {}, "vLLM exited with status 2 before it was healthy")
    second = TrialOutcome({}, FAILED, {}, {}, "vLLM was not healthy within 900 s")
    study.fill([first, second])
    assert study.report() == EXIT_FAILED
    assert not study.configs.exists()
    err = capsys.readouterr().err
    assert "no trial served the window; nothing written" in err
    assert "First failure: trial 0: vLLM exited with status 2 before it was healthy" in err


def test_an_empty_study_writes_nothing_and_exits_1(study: Study, capsys) -> None:
    assert study.report() == EXIT_FAILED
    assert not study.configs.exists()
    assert "First failure: none; no trial has finished its window" in capsys.readouterr().err


def test_next_steps_say_what_the_servers_figure_rests_on() -> None:
    spec = Path("studies/x.yaml")
    busy = {"throughput_req_per_s": 2.5, "waiting_peak": 12.0}
    lines = next_steps(4, busy, Offered(requests=600, replay_s=60.0), spec)
    assert lines[0].startswith(f"next: relax the SLOs in {spec} ")
    assert "the window offers 10.00 req/s (600 requests over its 60.0 s replay)" in lines[1]
    assert "trial 4 completed 2.50 req/s" in lines[1]
    assert lines[2].startswith("  roughly 4 servers like trial 4 (10.00 / 2.50, rounded up")
    assert lines[2].endswith("vLLM's waiting queue peaked at 12")


def test_next_steps_when_one_server_keeps_up_or_nothing_queued() -> None:
    spec = Path("s.yaml")
    kept_up = next_steps(0, {"throughput_req_per_s": 10.5}, Offered(600, 60.0), spec)
    assert kept_up[2].startswith("  one server like trial 0 completes the window's rate")
    assert "(10.50 >= 10.00 req/s)" in kept_up[2]
    idle = next_steps(
        0, {"throughput_req_per_s": 9.0, "waiting_peak": 0.0}, Offered(600, 60.0), spec
    )
    assert idle[2].startswith("  roughly 2 servers like trial 0")
    assert "vLLM queued no request" in idle[2]


def test_next_steps_of_a_closed_loop_give_no_servers_figure() -> None:
    lines = next_steps(2, {"throughput_req_per_s": 3.0}, None, Path("s.yaml"))
    assert len(lines) == 2
    assert "trial 2 completed 3.00 req/s" in lines[1]
    assert "closed-loop" in lines[1] and "no servers figure" in lines[1]
