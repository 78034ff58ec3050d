"""``tuner run --gpus all`` as a user runs it, on two GPUs that a stand-in ``nvidia-smi`` lists,
each trial's server the stand-in server (``tuner.testing.standin``, which logs the
``CUDA_VISIBLE_DEVICES`` it was started with).

Two workers, one per GPU, share a journal file; then the confirmation runs on GPU 0 alone.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
import uuid
from pathlib import Path

import optuna
import pytest
from conftest import (
    MARKER,
    cpu_spec,
    run_tuner,
    tuner_command,
    wait_for_no_processes,
    write_small_trace,
    write_spec,
)
from optuna.trial import TrialState

from tuner.cli.exits import EXIT_INTERRUPTED, MEETS_SLOS_EXITS
from tuner.study.store.record import TrialRecord
from tuner.study.store.storage import storage_of

pytestmark = pytest.mark.vllm

GPUS = {0: "GPU-aaaaaaaa-0000", 1: "GPU-bbbbbbbb-1111"}
NVIDIA_SMI = "#!/bin/sh\n" + "".join(
    f"echo '{i}, {uuid_}, 143771, NVIDIA H200'\n" for i, uuid_ in GPUS.items()
)


def on_two_gpus(
    tmp_path: Path, stand_in_vllm: dict[str, str], marker: str, monkeypatch: pytest.MonkeyPatch
) -> dict[str, str]:
    """The environment of a run on the two GPUs ``NVIDIA_SMI`` lists (a stand-in ``nvidia-smi``
    first on ``PATH``), its servers the stand-in, its processes marked with ``marker``; the
    test's own ``CUDA_VISIBLE_DEVICES`` unset (a run's environment is this process's with the
    returned one over it, and ``--gpus all`` means the GPUs it leaves visible)."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text(NVIDIA_SMI)
    (bin_dir / "nvidia-smi").chmod(0o755)
    return {**stand_in_vllm, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", MARKER: marker}


def test_two_gpus_run_one_worker_each_and_confirm_on_one(
    tmp_path: Path, cpu_model: Path, stand_in_vllm: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each trial records the GPU its worker was given, and its server saw that GPU; no two
    trials measure one configuration at once; the confirmation's fresh measurements are all on
    GPU 0; the run ends with the study's result, as on one GPU."""
    spec = cpu_spec(cpu_model, window_s=2, time_scale=1, n_trials=5)
    spec |= {"confirm_top_k": 1, "confirm_repeats": 1}
    write_spec(tmp_path / "spec.yaml", spec)
    write_small_trace(tmp_path / "trace.csv")
    marker = uuid.uuid4().hex
    env = {**on_two_gpus(tmp_path, stand_in_vllm, marker, monkeypatch), "STAND_IN_TOKEN_S": "0.01"}
    args = ["run", "--trace", tmp_path / "trace.csv", "--study", "g", "--spec"]
    done = run_tuner(*args, tmp_path / "spec.yaml", "--gpus", "all", cwd=tmp_path, env=env,
                     timeout_s=600)  # fmt: skip
    out = done.stdout
    assert done.returncode in MEETS_SLOS_EXITS, out + done.stderr
    assert wait_for_no_processes(marker) == []
    assert "2 workers, one per GPU, 5 trials in all" in out
    for index in GPUS:
        assert re.search(rf"^gpu {index} \| trial +\d+", out, re.M), out
    assert "confirming on GPU 0 alone: CUDA_VISIBLE_DEVICES=0 tuner run" in out
    # The workers write no configuration and print no result: the confirmation's run does.
    workers = out.partition("confirming on GPU 0 alone")[0]
    assert workers.count("no configuration written: the confirmation is left to a later") == 2
    assert "wrote" not in workers.replace("wrote a default", "")
    # The study's result is the last thing said, by the confirmation's run.
    tail = out.rpartition("confirming on GPU 0 alone")[2]
    assert "wrote" in tail and "report: tuner report g --storage journal:studies/g.log" in tail

    study = optuna.load_study(
        study_name="g", storage=storage_of(f"journal:{tmp_path / 'studies' / 'g.log'}")
    )
    trials = [t for t in study.trials if t.state == TrialState.COMPLETE]
    searched = [t for t in trials if TrialRecord.of(t).fresh is None]
    fresh = [t for t in trials if TrialRecord.of(t).fresh is not None]
    assert len(searched) == 5
    for trial in trials:
        placement = TrialRecord.of(trial).placement
        assert placement is not None and len(placement.gpu_indices) == 1
        (index,) = placement.gpu_indices
        assert placement.gpu_uuids == (GPUS[index],)
        log = tmp_path / "runs" / "g" / f"trial-{trial.number:04d}" / "engine.log"
        assert f"gpus={index}\n" in log.read_text()
    assert {gpus_of(t) for t in searched} == {(0,), (1,)}
    assert fresh and all(gpus_of(t) == (0,) for t in fresh)
    # No configuration measured twice at once (a re-measurement is measured after its first).
    for a in trials:
        for b in trials:
            if a.number < b.number and a.params == b.params:
                ended, began = a.datetime_complete, b.datetime_start
                assert ended is not None and began is not None and ended <= began


def gpus_of(trial: optuna.trial.FrozenTrial) -> tuple[int, ...]:
    placement = TrialRecord.of(trial).placement
    assert placement is not None
    return placement.gpu_indices


@pytest.mark.parametrize(
    ("sig", "to_group"),
    [(signal.SIGINT, True), (signal.SIGTERM, False)],
    ids=["Ctrl-C-to-the-terminal's-group", "SIGTERM-to-tuner-alone"],
)
def test_interrupted_gpus_run_stops_every_worker(
    tmp_path: Path,
    cpu_model: Path,
    stand_in_vllm: dict[str, str],
    sig: int,
    to_group: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Ctrl-C at the terminal (SIGINT to the whole foreground group: tuner, its workers, their
    servers) or SIGTERM to tuner alone (``kill``, a container stopped) while both workers
    measure: exit 130, no worker and no server left, no trial left RUNNING, no confirmation
    started."""
    # Each trial replays 2 s of trace at time scale 300: ten minutes, far past the signal.
    write_spec(tmp_path / "spec.yaml", cpu_spec(cpu_model, window_s=2, time_scale=300, n_trials=4))
    write_small_trace(tmp_path / "trace.csv")
    marker = uuid.uuid4().hex
    env = {**os.environ, **on_two_gpus(tmp_path, stand_in_vllm, marker, monkeypatch)}
    command = tuner_command(
        "run", "--trace", tmp_path / "trace.csv", "--study", "i", "--spec", tmp_path / "spec.yaml",
        "--gpus", "all",
    )  # fmt: skip
    output = tmp_path / "tuner.out"
    journal = tmp_path / "studies" / "i.log"
    with output.open("wb") as out:
        # A session of its own, as a terminal's foreground job: its group is the one Ctrl-C hits.
        proc = subprocess.Popen(
            command, cwd=tmp_path, env=env, stdout=out, stderr=out, start_new_session=True
        )
    try:
        deadline = time.monotonic() + 300
        while len(_running(journal)) < 2:
            assert proc.poll() is None, output.read_text()
            assert time.monotonic() < deadline, output.read_text()
            time.sleep(0.5)
        if to_group:
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)
        assert proc.wait(timeout=120) == EXIT_INTERRUPTED, output.read_text()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    said = output.read_text()
    assert wait_for_no_processes(marker, timeout_s=30) == [], said
    assert _running(journal) == []
    assert "confirming on GPU" not in said


def _running(journal: Path) -> list[int]:
    """The numbers of the journal study's trials still RUNNING (none while it does not exist)."""
    if not journal.exists():
        return []
    try:
        study = optuna.load_study(study_name="i", storage=storage_of(f"journal:{journal}"))
    except KeyError:
        return []  # the study is not created yet
    return [t.number for t in study.trials if t.state == TrialState.RUNNING]
