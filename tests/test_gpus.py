"""Several GPUs: ``tuner run --gpus`` and what holds a study of several workers together.

The fast tests: which GPUs ``--gpus`` names (nvidia-smi's list given as a parameter), the
trials dealt over them, the command each worker runs, a move queued by two workers at once
measured once, a confirmation's pairs held to one device, and the Kubernetes Jobs of
``docs/workers.md``. The slow one runs ``tuner run
--gpus all`` under the stand-in server with a stand-in ``nvidia-smi`` that lists two GPUs
(``tests/test_gpus_run.py``).
"""

from __future__ import annotations

import optuna
import pytest
import yaml
from conftest import REPO, run_tuner, write_small_trace
from optuna.distributions import BaseDistribution, IntDistribution

from tuner.cli.exits import EXIT_BAD_INPUT
from tuner.cli.gpus import gpus_of, shares, without, without_gpus
from tuner.cli.parser import build_parser
from tuner.errors import InputError, TunerError
from tuner.study.plan.spec import parse_spec
from tuner.study.store.record import (
    ARGS_ATTR,
    BASELINE_ATTR,
    CONFIRMS_ATTR,
    FEASIBLE_ATTR,
    FRESH_ATTR,
    PLACE_ATTR,
    Placement,
    Queued,
)
from tuner.study.store.storage import dashboard_target
from tuner.study.trials import references
from tuner.study.trials.confirm import current as current_round
from tuner.study.trials.confirm import elsewhere
from tuner.study.trials.search import load_existing, open_study, queue_move

TWO_GPUS = "0, GPU-aaaaaaaa-0000, 143771, NVIDIA H200\n1, GPU-bbbbbbbb-1111, 143771, NVIDIA H200\n"


def test_gpus_names_every_gpu_or_the_indices_given_and_none_is_bad_input(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert [g.uuid for g in gpus_of("all", lambda: TWO_GPUS)] == [
        "GPU-aaaaaaaa-0000",
        "GPU-bbbbbbbb-1111",
    ]
    assert [g.index for g in gpus_of("1", lambda: TWO_GPUS)] == [1]
    assert [g.index for g in gpus_of("1,0,1", lambda: TWO_GPUS)] == [1, 0]
    with pytest.raises(InputError, match=r"'2' is not a GPU's index here \(0, 1\)"):
        gpus_of("0,2", lambda: TWO_GPUS)
    with pytest.raises(InputError, match="no GPU found"):
        gpus_of("all", lambda: "")


def test_gpus_all_on_a_machine_without_gpus_exits_2(tmp_path) -> None:
    """No nvidia-smi on the PATH: one line, exit 2, nothing written."""
    write_small_trace(tmp_path / "t.csv")
    done = run_tuner(
        "run", "--trace", tmp_path / "t.csv", "--gpus", "all", cwd=tmp_path,
        env={"PATH": str(tmp_path)},
    )  # fmt: skip
    assert done.returncode == EXIT_BAD_INPUT, done.stdout + done.stderr
    assert done.stderr == "tuner: --gpus all: no GPU found (nvidia-smi lists none)\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.csv"]


def test_trials_are_dealt_over_the_workers_and_each_runs_the_command_without_gpus() -> None:
    assert shares(5, 2) == [3, 2]
    assert shares(1, 3) == [1, 0, 0]
    assert sum(shares(23, 8)) == 23
    given = ["run", "--trace", "t.csv", "--gpus", "all", "--gpu=0,1", "--gp", "0", "--n-trials"]
    assert without_gpus([*given, "4"]) == ["run", "--trace", "t.csv", "--n-trials", "4"]


SPEC = {
    "model": "m",
    "dummy_model": None,
    "engine_args": {"load-format": "dummy"},
    "search_space": {
        "max-num-seqs": {"type": "int", "low": 1, "high": 32, "default": 16},
        "max-num-batched-tokens": {"type": "int", "low": 512, "high": 4096, "log": True},
    },
    "slos": {"e2e_p99_s": 10.0},
    "weights": {"e2e_p99_s": 1.0},
}


def test_a_move_queued_by_two_workers_at_once_is_measured_once(tmp_path) -> None:
    """Two workers that read the study before either queues: both queue the incumbent's same
    move, and both ask; the later trial is a duplicate, dropped unmeasured, and the next move
    queued is another configuration."""
    spec = parse_spec(SPEC)
    study = open_study("s", f"sqlite:///{tmp_path / 's.db'}", 0)
    baseline = study.ask()
    baseline.set_user_attr(BASELINE_ATTR, True)
    study.tell(baseline, 1.0)
    queue_move(study, spec)
    (waiting,) = study.get_trials(states=(optuna.trial.TrialState.WAITING,))
    # The second worker, which read the study before the first queued, proposes the same.
    study.enqueue_trial(waiting.system_attrs["fixed_params"], user_attrs=waiting.user_attrs)
    first, second = study.ask(), study.ask()
    assert Queued.of(first).move == Queued.of(second).move is not None
    assert references.duplicate_of(study, first) is None
    assert references.duplicate_of(study, second) == first.number
    references.drop_duplicate(study, second, first.number)
    queue_move(study, spec)
    third = study.ask()
    assert references.duplicate_of(study, third) is None
    frozen = study.get_trials()
    fixed = [frozen[t.number].system_attrs["fixed_params"] for t in (first, third)]
    assert fixed[0] != fixed[1]


HERE = Placement("host-a", (0,), ("GPU-aaaaaaaa-0000",))
OTHER_GPU = Placement("host-a", (1,), ("GPU-bbbbbbbb-1111",))


def measured(
    study: optuna.Study, seqs: int | None, value: float, place: Placement, **queued: int
) -> None:
    params = {} if seqs is None else {"max-num-seqs": seqs}
    attrs = {FEASIBLE_ATTR: True, ARGS_ATTR: params, PLACE_ATTR: place.as_attr()}
    attrs |= {CONFIRMS_ATTR: queued["confirms"], FRESH_ATTR: queued["fresh"]} if queued else {}
    if seqs is None and not queued.get("confirms"):
        attrs[BASELINE_ATTR] = True
    dists: dict[str, BaseDistribution] = {}
    if seqs is not None:
        dists["max-num-seqs"] = IntDistribution(1, 32)
    study.add_trial(
        optuna.trial.create_trial(params=params, distributions=dists, value=value, user_attrs=attrs)
    )


def test_a_confirmation_compares_only_pairs_measured_on_one_device(tmp_path) -> None:
    """The round's device is its first fresh measurement's host and GPU: a fresh measurement
    of the baseline on another GPU is set aside (counted as taken, never compared), and a
    worker on another GPU does not continue the round."""
    study = open_study("s", f"sqlite:///{tmp_path / 's.db'}", 0)
    measured(study, None, 1.0, HERE)  # 0: the baseline
    measured(study, 8, 0.5, HERE)  # 1: the finalist
    measured(study, 8, 0.5, HERE, confirms=1, fresh=1)  # 2
    measured(study, None, 0.4, OTHER_GPU, confirms=0, fresh=1)  # 3: elsewhere, faster
    measured(study, None, 1.0, HERE, confirms=0, fresh=1)  # 4
    state = current_round(study, 3)
    assert state is not None and state.device == HERE
    assert [t.number for t in state.finalist_fresh.trials] == [2]
    assert [t.number for t in state.baseline_fresh.trials] == [4]
    assert state.taken == 3
    # Trial 3 beat the finalist's fresh measurement, but on another GPU: no pair against it.
    assert state.against is None
    assert state.next_arm() == "baseline"
    assert elsewhere(state, HERE) is None
    said = elsewhere(state, OTHER_GPU)
    assert said is not None and "is measured on host-a, GPU 0 (GPU-aaaaaaaa-0000)" in said


JOBS = REPO / "examples" / "container"


def test_the_kubernetes_jobs_run_a_worker_a_gpu_then_one_confirmation() -> None:
    """``workers-job.yaml``: an Indexed Job of pods of one GPU each, every pod a worker with
    ``--no-confirm`` on the PostgreSQL study its Secret names; ``confirm-job.yaml``: one pod of
    one GPU that confirms it. Parsed here; not applied to a cluster."""
    workers = yaml.safe_load((JOBS / "workers-job.yaml").read_text())
    confirm = yaml.safe_load((JOBS / "confirm-job.yaml").read_text())
    assert workers["spec"]["completionMode"] == "Indexed"
    assert workers["spec"]["parallelism"] == workers["spec"]["completions"] > 1
    for job, flag in ((workers, "no_confirm"), (confirm, "confirm_only")):
        assert job["kind"] == "Job" and job["spec"]["backoffLimit"] == 0
        (container,) = job["spec"]["template"]["spec"]["containers"]
        assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
        (env,) = container["env"]
        assert env["valueFrom"]["secretKeyRef"] == {"name": "tuner-storage", "key": "url"}
        parsed = build_parser().parse_args(container["args"])
        assert parsed.storage == f"$({env['name']})" and getattr(parsed, flag)
        assert parsed.study == "prod" and parsed.gpus is None


def test_a_journal_file_is_a_storage_that_runs_and_reports_open(tmp_path) -> None:
    """``journal:PATH``: opened (and made) by a run, read by a report; a report of a file not
    there, or a run in a folder not there, is one line naming it."""
    url = f"journal:{tmp_path / 's.log'}"
    study = open_study("s", url, 0)
    study.tell(study.ask(), 1.0)
    assert [t.value for t in load_existing("s", url).trials] == [1.0]
    assert (tmp_path / "s.log.open-lock").exists()
    with pytest.raises(InputError, match="no study database at"):
        load_existing("s", f"journal:{tmp_path / 'other.log'}")
    with pytest.raises(TunerError, match=r"\(folder .*missing does not exist\)"):
        open_study("s", f"journal:{tmp_path / 'missing' / 's.log'}", 0)


def test_the_dashboard_is_given_a_journals_file_and_a_urls_password_masked() -> None:
    assert dashboard_target("journal:studies/prod.log") == "studies/prod.log"
    shown = dashboard_target("postgresql://tuner:secret@db/tuner")
    assert "secret" not in shown and shown.startswith("postgresql://tuner:")


def test_the_options_the_parent_sets_for_each_worker_are_given_once() -> None:
    given = ["run", "--trace", "t.csv", "--n-trials", "4", "--time-budget-s=600", "--stor", "x"]
    assert without(given, "--n-trials", "--time-budget-s", "--storage") == [
        "run",
        "--trace",
        "t.csv",
    ]
