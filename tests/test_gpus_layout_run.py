"""``tuner run --gpus all`` of a capacity study on four GPUs that a stand-in ``nvidia-smi`` lists:
the layouts measured first, each on its first GPUs, then one worker per group of the layout kept,
then the confirmation on the first group; each trial's server the stand-in server
(``tuner.testing.standin``), which honours ``tensor-parallel-size`` and ``data-parallel-size``: a
server of t x d GPUs streams t x d times the slots, its tokens t times faster. So TP2 carries
twice what TP1 does per GPU, and TP2 x DP2 as much as TP2 per GPU: a tie, which the smaller
server wins. The winner is known: tensor-parallel-size 2, two workers of two GPUs.

The layouts' capacities are measured on the stand-in, not on GPUs: they say what tuner does with
what it measures, nothing of vLLM.
"""

from __future__ import annotations

import os
import re
import uuid
from pathlib import Path

import optuna
import pytest
from conftest import (
    MARKER,
    cpu_spec,
    run_tuner,
    wait_for_no_processes,
    write_spec,
)
from optuna.trial import TrialState

from tuner.cli.exits import MEETS_SLOS_EXITS
from tuner.study.plan.layouts import Layout, layout_of
from tuner.study.store.record import Queued, TrialRecord
from tuner.study.store.storage import storage_of
from tuner.study.trials import layout_phase

pytestmark = pytest.mark.vllm

GPUS = {i: f"GPU-{i}{i}{i}{i}aaaa-000{i}" for i in range(4)}
NVIDIA_SMI = "#!/bin/sh\n" + "".join(
    f"echo '{i}, {uuid_}, 143771, NVIDIA H200'\n" for i, uuid_ in GPUS.items()
)
MEASURED = {"1x1": (0,), "1x4": (0, 1, 2, 3), "2x1": (0, 1), "2x2": (0, 1, 2, 3)}


def test_four_gpus_measure_the_layouts_then_search_on_groups_of_the_one_kept(
    tmp_path: Path, cpu_model: Path, stand_in_vllm: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text(NVIDIA_SMI)
    (bin_dir / "nvidia-smi").chmod(0o755)
    spec = cpu_spec(cpu_model, window_s=10, time_scale=1, n_trials=2)
    spec |= {
        "objective_mode": "capacity",
        "search_space": {"max-num-seqs": {"type": "int", "low": 1, "high": 32}},
        # One request streamed at a time on one GPU, 30 tokens of 5 ms: 6.7 req/s at most; TP2
        # 26.7 (two slots, 2.5 ms a token), TP1 x DP4 26.7, TP2 x DP2 53. A TTFT of 0.1 s holds
        # no more than a few requests queued, so each rate of 40 requests or more is judged
        # near what the server can do, not on how long a queue that few requests build.
        "slos": {"ttft_p95_s": 0.1, "tpot_p95_s": 1.0, "e2e_p99_s": 30.0},
        "weights": {"ttft_p95_s": 1.0, "tpot_p95_s": 1.0, "e2e_p99_s": 1.0},
        "capacity_probe_s": 2,
        "capacity_min_requests": 40,
        "capacity_max_probes": 8,
        "capacity_resolution": 0.1,
        "confirm_top_k": 1,
        "confirm_repeats": 1,
    }
    write_spec(tmp_path / "spec.yaml", spec)
    # 80 requests over 10 s, each 30 tokens out: every rate's requests alike.
    rows = "".join(f"{0.125 * i},{20 + i % 40},30\n" for i in range(80))
    (tmp_path / "trace.csv").write_text("timestamp,input_tokens,output_tokens\n" + rows)
    marker = uuid.uuid4().hex
    env = {
        **stand_in_vllm,
        "STAND_IN_TOKEN_S": "0.005",
        "STAND_IN_SLOTS": "1",
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        MARKER: marker,
    }
    # A run's environment is this process's with ``env`` over it: ``--gpus all`` means the GPUs
    # the test's own CUDA_VISIBLE_DEVICES leaves visible, so that is unset.
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    args = ["run", "--trace", tmp_path / "trace.csv", "--study", "g", "--spec"]
    done = run_tuner(*args, tmp_path / "spec.yaml", "--gpus", "all", cwd=tmp_path, env=env,
                     timeout_s=900)  # fmt: skip
    out = done.stdout
    assert done.returncode in MEETS_SLOS_EXITS, out + done.stderr
    assert wait_for_no_processes(marker) == []

    # The layouts, each on the first of the GPUs, one after another.
    assert "layouts measured before the search (the model's weights " in out
    for name, gpus in MEASURED.items():
        visible = ",".join(map(str, gpus))
        assert re.search(
            rf"^layout {name} \| .* on GPUs? {visible}: CUDA_VISIBLE_DEVICES={visible} tuner run "
            rf".*--layout {name} --n-trials 1 --no-confirm$",
            out,
            re.M,
        ), out
        assert re.search(rf"^layout {name} \| trial +\d+ ", out, re.M), out
    study = optuna.load_study(
        study_name="g", storage=storage_of(f"journal:{tmp_path / 'studies' / 'g.log'}")
    )
    # Measured: served in full, or screened out at the gate (pruned, its one window recorded).
    measured = [t for t in study.trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    trials = [t for t in measured if t.state == TrialState.COMPLETE]
    by_layout = {Queued.of(t).layout or "1x1": t for t in trials[:4]}
    assert set(by_layout) == set(MEASURED)
    for name, trial in by_layout.items():
        recorded = TrialRecord.of(trial)
        assert recorded.baseline and layout_of(recorded.engine_args) == Layout.parse(name)
        assert gpus_of(trial) == MEASURED[name]
        log = tmp_path / "runs" / "g" / f"trial-{trial.number:04d}" / "engine.log"
        assert f"gpus={','.join(map(str, MEASURED[name]))}\n" in log.read_text()
    capacity = {name: TrialRecord.of(t).capacity_req_per_s or 0.0 for name, t in by_layout.items()}
    said = f"{capacity}\n{out}"
    # TP2 carries about twice TP1 per GPU on the stand-in; TP2 x DP2 about as much per GPU.
    assert capacity["2x1"] / 2 > 1.5 * capacity["1x1"], said
    kept = layout_phase.kept_layout(study)
    assert kept == Layout(2, 1), said
    assert "layout kept: 2 GPUs: tensor-parallel-size 2, the most req/s per GPU" in out, said

    # Two workers, one per group of two GPUs, each trial at the kept layout.
    assert "2 workers, one per 2 GPUs (2 GPUs: tensor-parallel-size 2), 2 trials in all" in out, (
        said
    )
    for group in ("0,1", "2,3"):
        assert re.search(
            rf"^gpus {group} \| .*CUDA_VISIBLE_DEVICES={group} tuner run .*--layout 2x1", out, re.M
        ), out
    rest = [t for t in measured if t.number > trials[3].number]
    searched = [t for t in rest if TrialRecord.of(t).confirms is None]
    again = [t for t in rest if TrialRecord.of(t).confirms is not None]
    assert searched and {gpus_of(t) for t in searched} <= {(0, 1), (2, 3)}, said
    assert all(layout_of(TrialRecord.of(t).engine_args) == kept for t in rest), said
    # The baseline at the kept layout was measured in the layout phase, not again by a worker.
    assert not any(TrialRecord.of(t).baseline for t in searched), said
    # The confirmation on the first group alone: the finalist and the baseline measured again
    # there (or the baseline alone, where no searched configuration passed its gate).
    assert "confirming on GPUs 0,1 alone: CUDA_VISIBLE_DEVICES=0,1 tuner run" in out
    assert again and all(gpus_of(t) == (0, 1) for t in again), said
    header = (tmp_path / "configs" / "g.yaml").read_text()
    assert "\ntensor-parallel-size: 2\n" in header
    assert "# One server on 2 GPUs (tensor-parallel-size 2): CUDA_VISIBLE_DEVICES names them." in (
        header
    )
    assert re.search(
        r"^# servers for the peak \([\d.]+ req/s\): \d+ like trial \d+ \(.*\), \d+ GPUs: one "
        r"server \(2 GPUs: tensor-parallel-size 2\) carries [\d.]+ req/s, [\d.]+ per GPU$",
        header,
        re.M,
    ), header


def gpus_of(trial: optuna.trial.FrozenTrial) -> tuple[int, ...]:
    placement = TrialRecord.of(trial).placement
    assert placement is not None
    return placement.gpu_indices
