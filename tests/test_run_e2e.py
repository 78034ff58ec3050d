"""``tuner run`` end to end: the command line, real vLLM (CPU build), a slice of a shipped trace.

One study of three trials is shared by most tests here (each trial starts a real server, about
a minute on two cores); the other vLLM tests start as little as they need. Every ``tuner run``
is a subprocess carrying a marker in its environment, which every process it starts inherits,
so "no process left behind" is checked by scanning ``/proc`` for that marker.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import optuna
import pytest
import yaml
from conftest import (
    MARKER,
    SHIPPED_TRACE,
    cpu_spec,
    listening_sockets,
    marked_processes,
    run_tuner,
    stop_group,
    tuner_command,
    wait_for_no_processes,
    write_spec,
)
from optuna.trial import FrozenTrial, TrialState

from tuner.cli.exits import MEETS_SLOS_EXITS
from tuner.engine.dummy_model import write_model
from tuner.engine.environment import command_to_serve
from tuner.engine.local import free_port
from tuner.load.http import ReplaySettings
from tuner.study.measure.scoring import FAILED, score
from tuner.study.measure.trial import Criteria, TrialOutcome, TrialSetup
from tuner.study.plan.spec import parse_spec
from tuner.study.result.choice import choose
from tuner.study.trials.picks import best_trial
from tuner.study.trials.search import open_study, run_study

STUDY = "azure-slice"
# A secret in the environment of the shared run: no file it writes may hold it.
SECRET = "hf_" + uuid.uuid4().hex


def load_trials(storage: str, name: str) -> list[FrozenTrial]:
    return optuna.load_study(study_name=name, storage=storage).get_trials(deepcopy=False)


def without_server_lines(text: str) -> str:
    return "".join(
        line for line in text.splitlines(keepends=True) if not line.startswith(("host:", "port:"))
    )


@dataclass
class Run:
    """A finished ``tuner run`` and where it wrote."""

    folder: Path
    storage: str
    result: subprocess.CompletedProcess[str]
    trials: list[FrozenTrial]
    left_behind: list[str]
    # (address, port) of every socket the run's processes were seen listening on.
    listening: set[tuple[str, int]] = field(default_factory=set)

    @property
    def config(self) -> Path:
        return self.folder / "configs" / f"{STUDY}.yaml"

    def args(self, n_trials: int) -> list[str | Path]:
        return [
            "run",
            "--trace",
            SHIPPED_TRACE,
            "--study",
            STUDY,
            "--spec",
            self.folder / "spec.yaml",
            "--storage",
            self.storage,
            "--n-trials",
            str(n_trials),
            "--configs",
            self.folder / "configs",
            "--runs",
            self.folder / "runs",
        ]


@pytest.fixture(scope="module")
def demo_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Quick start's ``cpu-tiny`` model with saved weights (random values): the study
    measures it on random weights (``load-format: dummy``, as ``tuner run --dummy-weights``
    does), and the file it emits, which drops that, serves these.

    Not ``cpu-demo`` (twice the layers and hidden size): with it, on a 2-core machine with two
    busy loops and another test process beside, the window's 19 long prompts took trials of
    6 minutes (TTFT p95 217 s) and the study ran past its 900 s guard."""
    return write_model(tmp_path_factory.mktemp("model") / "cpu-tiny", "cpu-tiny")


@pytest.fixture(scope="module")
def study(demo_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Run:
    """Three trials (the baseline and two from the search space) on the trace's busiest second.

    Run with ``HF_TOKEN`` set to ``SECRET`` and tuner's log on (``-v``, into ``tuner.err``); the
    sockets its processes listen on are sampled twice a second while it runs.
    """
    folder = tmp_path_factory.mktemp("study")
    write_spec(folder / "spec.yaml", cpu_spec(demo_model, window_s=1))
    run = Run(folder, f"sqlite:///{folder / 'study.db'}", None, [], [])  # type: ignore[arg-type]
    marker = uuid.uuid4().hex
    env = {**os.environ, MARKER: marker, "HF_TOKEN": SECRET}
    out, err = folder / "tuner.out", folder / "tuner.err"
    with out.open("wb") as stdout, err.open("wb") as stderr:
        proc = subprocess.Popen(
            tuner_command("-v", *run.args(3)), cwd=folder, env=env, stdout=stdout, stderr=stderr
        )
        deadline = time.monotonic() + 900
        while proc.poll() is None and time.monotonic() < deadline:
            pids = [int(line.split()[0]) for line in marked_processes(marker)]
            run.listening |= listening_sockets(pids)
            time.sleep(0.5)
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    run.result = subprocess.CompletedProcess(
        proc.args, proc.returncode, out.read_text(), err.read_text()
    )
    run.trials = load_trials(run.storage, STUDY)
    run.left_behind = wait_for_no_processes(marker)
    return run


@pytest.mark.xdist_group("run-e2e-study")
@pytest.mark.vllm
def test_run_of_three_trials(study: Run) -> None:
    result = study.result
    assert result.returncode in MEETS_SLOS_EXITS, result.stderr[-3000:]
    assert "window: " in result.stdout and "of the trace, replayed over 4.0 s" in result.stdout
    assert "launcher: process (auto)" in result.stdout  # the CPU build: a fresh interpreter
    assert len(study.trials) == 3
    assert all(t.state == TrialState.COMPLETE for t in study.trials)
    baseline, *searched = study.trials
    assert baseline.user_attrs["baseline"] is True
    assert baseline.user_attrs["engine_args"] == {
        "load-format": "dummy",
        "max-model-len": 4096,
        "enforce-eager": True,
        "dtype": "float32",
        "gpu-memory-utilization": 0.2,
    }
    for trial in searched:
        args = trial.user_attrs["engine_args"]
        assert "baseline" not in trial.user_attrs
        assert 1 <= args["max-num-seqs"] <= 32
        assert args["gpu-memory-utilization"] in (0.1, 0.15, 0.2, 0.25)
        assert args == {**args, "load-format": "dummy", "max-model-len": 4096}
    for trial in study.trials:
        attrs = trial.user_attrs
        assert attrs["feasible"] is True, attrs.get("reason")
        assert attrs["requests_ok"] == attrs["requests"] > 5
        assert attrs["server_requests_succeeded"] == attrs["requests"]
        assert attrs["ttft_p95_s"] > 0 and attrs["tpot_p95_s"] > 0
        assert attrs["time_engine_healthy_s"] > 0
        assert f"trial {trial.number:>3}" in result.stdout
    assert study.config.exists()


@pytest.mark.xdist_group("run-e2e-study")
@pytest.mark.vllm
def test_no_process_outlives_the_run(study: Run) -> None:
    assert study.left_behind == []


@pytest.mark.xdist_group("run-e2e-study")
@pytest.mark.vllm
def test_servers_listen_on_127_0_0_1_only(study: Run) -> None:
    """Every socket that tuner or a vLLM process of the run listened on was on 127.0.0.1."""
    assert study.listening, "no listening socket seen: the sampling missed the servers"
    assert {address for address, _ in study.listening} == {"127.0.0.1"}, study.listening


@pytest.mark.xdist_group("run-e2e-study")
@pytest.mark.vllm
def test_no_secret_in_any_file_written(study: Run) -> None:
    """``HF_TOKEN`` was set for the run (vLLM needs it for gated models): it is in no file the
    run wrote (the study database, the YAML, the engine configs and logs, tuner's own log)."""
    written = [path for path in study.folder.rglob("*") if path.is_file()]
    assert study.folder / "study.db" in written and study.config in written
    assert any(path.name == "engine.log" for path in written)
    assert "INFO" in study.result.stderr  # tuner's log was on
    holding = [path for path in written if SECRET.encode() in path.read_bytes()]
    assert holding == []


@pytest.mark.xdist_group("run-e2e-study")
@pytest.mark.vllm
def test_emitted_config_is_what_the_chosen_trial_measured(study: Run, demo_model: Path) -> None:
    text = study.config.read_text()
    header = [line for line in text.splitlines() if line.startswith("#")]
    # The configuration tuner chose (vLLM's defaults unless a searched one beat them beyond the
    # spread): its trial's engine arguments, byte for byte.
    chosen = choose(optuna.load_study(study_name=STUDY, storage=study.storage))
    assert chosen is not None
    best = chosen.trial
    assert f"# Study '{STUDY}', trial {best.number}." in header
    body = text.split(f"# Serve with: {command_to_serve('<this file>')}\n", 1)[1]
    engine_yaml = study.folder / "runs" / STUDY / f"trial-{best.number:04d}" / "engine.yaml"
    # Byte for byte what the trial started from, less host and port and the random weights
    # (the file loads the model's real weights; its header says how it was measured).
    measured = without_server_lines(engine_yaml.read_text())
    assert body.encode() == measured.replace("load-format: dummy\n", "").encode()
    args = {k: v for k, v in best.user_attrs["engine_args"].items() if k != "load-format"}
    assert yaml.safe_load(text) == {"model": str(demo_model), **args}


@pytest.mark.xdist_group("run-e2e-study")
@pytest.mark.vllm
def test_client_and_server_means_agree(study: Run) -> None:
    """tuner's own TTFT and end-to-end means agree with what vLLM measured.

    A request reaches tuner after vLLM stamped it done, so tuner's figure is never below vLLM's.
    It is above by the API server's own work (within 10% here) and by any delay of tuner itself:
    on a machine short of CPU, tuner's process can be held for seconds (``client_lag_max_s``),
    and every request finishing then reads that much late. vLLM times requests with the wall
    clock and tuner with the monotonic one, so a trial during which the system clock was set
    (``wall_clock_step_s``) cannot be compared, and is left out.
    """
    steady = [t for t in study.trials if abs(t.user_attrs["wall_clock_step_s"]) < 0.05]
    if not steady:
        steps = [t.user_attrs["wall_clock_step_s"] for t in study.trials]
        pytest.skip(f"the system clock was set during every trial: {steps}")
    for trial in steady:
        attrs = trial.user_attrs
        lag_s = attrs["client_lag_max_s"]
        for client, server in (
            ("ttft_mean_s", "server_ttft_mean_s"),
            ("e2e_mean_s", "server_e2e_mean_s"),
        ):
            said = (
                f"trial {trial.number}: {client} {attrs[client]:.3f} s, "
                f"{server} {attrs[server]:.3f} s, tuner's own lag up to {lag_s:.3f} s"
            )
            assert attrs[client] >= attrs[server] - 0.005, said
            assert attrs[client] <= 1.10 * attrs[server] + lag_s, said
        if lag_s > 0.1:
            assert f"tuner's client ran up to {lag_s:.2f} s late" in study.result.stdout


@pytest.fixture
def served(study: Run) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """The emitted config, served by a real vLLM; yields its base URL and process."""
    assert study.config.exists(), study.result.stderr[-3000:]
    port = free_port()
    log = (study.folder / "serve.log").open("wb")
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--config",
            study.config,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        yield f"http://127.0.0.1:{port}", server
    finally:
        stop_group(server)
        log.close()


@pytest.mark.xdist_group("run-e2e-study")
@pytest.mark.vllm
def test_emitted_config_serves(served: tuple[str, subprocess.Popen[bytes]], study: Run) -> None:
    url, server = served
    deadline = time.monotonic() + 300
    with httpx.Client(base_url=url, timeout=30) as client:
        while True:
            try:
                if client.get("/health").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                # The root cause is logged well above the traceback's tail.
                lines = (study.folder / "serve.log").read_text(errors="replace").splitlines()
                errors = [line for line in lines if "Error" in line or "error" in line]
                pytest.fail("\n".join([*errors[:20], "...", *lines[-20:]]))
            time.sleep(0.5)
        model = yaml.safe_load(study.config.read_text())["model"]
        response = client.post(
            "/v1/completions",
            json={
                "model": model,
                "prompt": [5, 6, 7, 8],
                "max_tokens": 4,
                "ignore_eos": True,
                "temperature": 0,
            },
        )
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["usage"] == {**answer["usage"], "prompt_tokens": 4, "completion_tokens": 4}
    assert answer["choices"][0]["text"]


@pytest.mark.xdist_group("run-e2e-study")
@pytest.mark.vllm
def test_resume_adds_trials_and_keeps_the_baseline(study: Run) -> None:
    marker = uuid.uuid4().hex
    result = run_tuner(*study.args(1), cwd=study.folder, env={MARKER: marker}, timeout_s=600)
    assert result.returncode in MEETS_SLOS_EXITS, result.stderr[-3000:]
    assert "3 trials so far, adding 1" in result.stdout
    trials = load_trials(study.storage, STUDY)
    assert [t.number for t in trials] == [0, 1, 2, 3]
    assert [t.number for t in trials if t.user_attrs.get("baseline")] == [0]
    assert trials[3].state == TrialState.COMPLETE
    assert trials[3].user_attrs["engine_args"] != trials[0].user_attrs["engine_args"]
    # The first three are untouched.
    assert [t.user_attrs for t in trials[:3]] == [t.user_attrs for t in study.trials]
    assert wait_for_no_processes(marker) == []


@pytest.mark.xdist_group("run-e2e-study")
@pytest.mark.vllm
def test_zero_trials_writes_the_best_so_far_and_starts_nothing(study: Run) -> None:
    before = load_trials(study.storage, STUDY)
    emitted = study.config.read_text()
    study.config.unlink()
    result = run_tuner(*study.args(0), cwd=study.folder, timeout_s=120)
    assert result.returncode in MEETS_SLOS_EXITS, result.stderr[-3000:]
    assert "adding 0" in result.stdout and "starting vLLM" not in result.stdout
    assert len(load_trials(study.storage, STUDY)) == len(before)
    assert study.config.exists()
    # The study's best so far, written exactly as the run that measured it wrote it.
    assert study.config.read_text() == emitted


@pytest.mark.vllm
def test_rejected_engine_argument_is_an_infeasible_trial(cpu_model: Path, tmp_path: Path) -> None:
    """vLLM's argument parser takes ``max-model-len: 100000000`` (a value it refuses, ``dtype:
    bogus``, is exit 2 before any engine: tests/test_hostile_inputs.py), and its engine refuses
    it at start, past the model's positions; each trial is completed infeasible and the study
    ends."""
    spec = cpu_spec(cpu_model, window_s=1)
    spec["engine_args"]["max-model-len"] = 100_000_000
    write_spec(tmp_path / "spec.yaml", spec)
    storage = f"sqlite:///{tmp_path / 'bad.db'}"
    marker = uuid.uuid4().hex
    result = run_tuner(
        "run",
        "--trace",
        SHIPPED_TRACE,
        "--study",
        "bad",
        "--spec",
        tmp_path / "spec.yaml",
        "--storage",
        storage,
        "--n-trials",
        "2",
        "--configs",
        tmp_path / "configs",
        "--runs",
        tmp_path / "runs",
        cwd=tmp_path,
        env={MARKER: marker},
        timeout_s=600,
    )
    assert result.returncode == 1, result.stderr[-3000:]
    assert "no trial served the window; nothing written" in result.stderr
    assert "First failure: trial 0: vLLM exited with status" in result.stderr
    assert not (tmp_path / "configs").exists()
    assert best_trial(optuna.load_study(study_name="bad", storage=storage)) is None
    trials = load_trials(storage, "bad")
    assert [t.state for t in trials] == [TrialState.COMPLETE, TrialState.COMPLETE]
    for trial in trials:
        attrs = trial.user_attrs
        assert attrs["feasible"] is False
        assert "exited with status" in attrs["reason"]
        assert "max_model_len" in attrs["log_tail"]
    assert wait_for_no_processes(marker) == []


@pytest.mark.vllm
def test_impossible_slos_write_the_closest_and_exit_3(cpu_model: Path, tmp_path: Path) -> None:
    """A 1 ms TTFT SLO that no configuration meets: the one trial (the baseline) is written as
    the closest, its header names what it missed, and tuner says what to do next, exit 3."""
    slos = {"ttft_p95_s": 0.001, "tpot_p95_s": 5.0, "e2e_p99_s": 300.0}
    write_spec(tmp_path / "spec.yaml", cpu_spec(cpu_model, window_s=1, slos=slos))
    marker = uuid.uuid4().hex
    result = run_tuner(
        "run",
        "--trace",
        SHIPPED_TRACE,
        "--study",
        "slo",
        "--spec",
        tmp_path / "spec.yaml",
        "--storage",
        f"sqlite:///{tmp_path / 'slo.db'}",
        "--n-trials",
        "1",
        "--configs",
        tmp_path / "configs",
        "--runs",
        tmp_path / "runs",
        cwd=tmp_path,
        env={MARKER: marker},
        timeout_s=600,
    )
    assert result.returncode == 3, result.stdout[-3000:] + result.stderr[-3000:]
    text = (tmp_path / "configs" / "slo.yaml").read_text()
    lines = text.splitlines()
    assert lines[0] == "# meets SLOs: no"
    assert re.fullmatch(r"#   ttft_p95_s: [\d.]+ ms \(SLO 1 ms\)", lines[1]), lines[1]
    # What vLLM's /metrics said of the trial's window, as far as its CPU build exports it.
    assert lines[2].startswith("# where the time went (trial 0): "), lines[2]
    assert lines[3].startswith("# Tuned by tuner ")
    body = text.split(f"# Serve with: {command_to_serve('<this file>')}\n", 1)[1]
    engine_yaml = tmp_path / "runs" / "slo" / "trial-0000" / "engine.yaml"
    # What the trial was started from, less host and port, and less the random weights: the
    # file loads the model's real weights, and its header says how it was measured.
    measured = without_server_lines(engine_yaml.read_text())
    assert "load-format: dummy\n" in measured
    assert body.encode() == measured.replace("load-format: dummy\n", "").encode()
    assert "# Measured on random weights (load-format: dummy)" in text
    out = result.stdout
    assert "no trial met the SLOs; wrote the closest, trial 0, to " in out
    assert "    ttft_p95_s: " in out and "relax the SLOs in " in out
    assert "the window offers " in out and "trial 0 completed " in out
    assert (
        "no servers figure: more servers would not fix trial 0's misses: vLLM's prefill alone"
        in out
    ), out[-2000:]
    # Not a terminal: one line as the trial starts, one as it ends, and no live status line.
    trial_lines = [line for line in out.splitlines() if line.startswith("trial   0")]
    assert len(trial_lines) == 2, trial_lines
    assert re.search(r"  starting vLLM \(pid \d+\) \.\.\.$", trial_lines[0]), trial_lines[0]
    assert "[infeasible, baseline]" in trial_lines[1]
    assert "\r" not in out
    assert wait_for_no_processes(marker) == []


def _wait_for(predicate, timeout_s: float, what: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert proc.poll() is None, f"tuner exited ({proc.returncode}) before {what}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


# What ``tuner run`` prints, off a terminal, once a trial's vLLM process has been started.
STARTED = re.compile(r"^trial +0  .*  starting vLLM \(pid (\d+)\) \.\.\.$", re.M)


def _group(pgid: int) -> list[str]:
    """``pid cmdline`` of every process in process group ``pgid`` that has not ended."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            # The command may hold spaces and parentheses: the fields follow its last ")".
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue  # gone
        if int(fields[2]) == pgid and fields[0] != "Z":  # a zombie is no process left running
            found.append(f"{entry.name} {cmdline.decode(errors='replace')}")
    return found


@pytest.mark.vllm
@pytest.mark.parametrize(
    ("sig", "moment"),
    [(signal.SIGINT, "replaying"), (signal.SIGTERM, "starting")],
    ids=["SIGINT-while-replaying", "SIGTERM-while-starting"],
)
def test_interrupted_run_leaves_nothing_behind(
    cpu_model: Path, tmp_path: Path, sig: signal.Signals, moment: str
) -> None:
    """SIGINT while the window replays, SIGTERM while vLLM starts: exit 130, no vLLM process
    of the run survives, and the storage keeps no trial RUNNING.

    The test waits on what tuner says (the trial's start line with vLLM's pid, and, logging,
    that vLLM is healthy), and the run cannot end before the signal: each of its two trials
    replays a window of 600 s."""
    write_spec(tmp_path / "spec.yaml", cpu_spec(cpu_model, window_s=1, time_scale=600))
    storage = f"sqlite:///{tmp_path / 'int.db'}"
    marker = uuid.uuid4().hex
    command = tuner_command(
        "-v",
        "run",
        "--trace",
        SHIPPED_TRACE,
        "--study",
        "int",
        "--spec",
        tmp_path / "spec.yaml",
        "--storage",
        storage,
        "--n-trials",
        "2",
        "--configs",
        tmp_path / "configs",
        "--runs",
        tmp_path / "runs",
    )
    output = tmp_path / "tuner.out"

    def said() -> str:
        return output.read_text(errors="replace")

    with output.open("wb") as out:
        proc = subprocess.Popen(
            command, cwd=tmp_path, env={**os.environ, MARKER: marker}, stdout=out, stderr=out
        )
    try:
        _wait_for(lambda: STARTED.search(said()), 300, "trial 0's vLLM process", proc)
        found = STARTED.search(said())
        assert found is not None
        server = int(found[1])
        if moment == "starting":
            # vLLM's engine core (its process titled VLLM::EngineCore) has started in the
            # server's process group: the group stop must take it.
            _wait_for(
                lambda: any("EngineCore" in p for p in _group(server)),
                300,
                "vLLM's engine core",
                proc,
            )
        else:
            # Healthy, then two seconds into the window.
            _wait_for(lambda: "vLLM healthy after" in said(), 300, "vLLM's /health", proc)
            time.sleep(2.0)
        assert marked_processes(marker)  # the run is live: tuner and vLLM
        proc.send_signal(sig)
        assert proc.wait(timeout=90) == 130, said()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "interrupted" in said()
    assert wait_for_no_processes(marker) == []
    trials = load_trials(storage, "int")
    assert [t.state for t in trials] == [TrialState.FAIL]
    assert trials[0].user_attrs["reason"] == "interrupted: KeyboardInterrupt"
    assert not (tmp_path / "configs").exists()


@pytest.mark.parametrize("defaults", [True, False])
def test_malformed_trace_exits_2_and_writes_nothing(tmp_path: Path, defaults: bool) -> None:
    trace = tmp_path / "prod.csv"
    trace.write_text("timestamp,input_tokens,output_tokens\n0,10,5\n1.5,ten,5\n3,10,5\n")
    args: list[str | Path] = ["run", "--trace", trace]
    if not defaults:
        args += ["--spec", tmp_path / "spec.yaml", "--storage", f"sqlite:///{tmp_path}/x.db"]
        args += ["--configs", tmp_path / "configs", "--runs", tmp_path / "runs"]
    result = run_tuner(*args, cwd=tmp_path, timeout_s=120)
    assert result.returncode == 2, result.stderr
    assert f"{trace}:3:" in result.stderr
    assert "input_tokens" in result.stderr
    assert "Traceback" not in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["prod.csv"]


def test_concurrency_trace_without_lengths_exits_2_and_writes_nothing(tmp_path: Path) -> None:
    trace = tmp_path / "running.csv"
    trace.write_text("timestamp,concurrency\n0,2\n15,5\n30,3\n")
    result = run_tuner("run", "--trace", trace, cwd=tmp_path, timeout_s=120)
    assert result.returncode == 2, result.stderr
    assert "is a concurrency trace: give request lengths" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["running.csv"]


# The study loop of ``tuner run`` with a stand-in trial runner (the ``runner`` seam), in
# milliseconds: the same properties as above, at the edges that vLLM is too slow to reach.

SPACE_SPEC = {
    "model": "m",
    "dummy_model": None,
    "engine_args": {"load-format": "dummy"},
    "baseline": {"gpu-memory-utilization": 0.2},
    "search_space": {"max-num-seqs": {"type": "int", "low": 1, "high": 32}},
    "slos": {"e2e_p99_s": 10.0},
    "weights": {"e2e_p99_s": 1.0},
}


def stand_in_setup() -> TrialSetup:
    return TrialSetup(
        model="m",
        requests=(),
        replay=ReplaySettings(model="m", vocab_size=100),
        criteria=Criteria(slos={"e2e_p99_s": 10.0}, weights={"e2e_p99_s": 1.0}),
    )


def by_seqs(args, setup, workdir, should_stop=None) -> TrialOutcome:
    """The more sequences the lower the score, but above 16 requests fail: infeasible."""
    seqs = args.get("max-num-seqs", 8)
    metrics = {"e2e_p99_s": (33 - seqs) / 10, "error_rate": 0.0 if seqs <= 16 else 0.5}
    return TrialOutcome(
        args, score(metrics, Criteria({"e2e_p99_s": 10.0}, {"e2e_p99_s": 1.0})), metrics, {}
    )


def test_study_loop_records_failures_and_never_picks_one(tmp_path: Path) -> None:
    spec = parse_spec(SPACE_SPEC)
    storage = f"sqlite:///{tmp_path / 's.db'}"
    seen: list[int] = []

    def runner(args, setup, workdir, should_stop=None) -> TrialOutcome:
        seen.append(len(seen))
        if len(seen) == 2:  # the second trial's engine fails to start
            return TrialOutcome(args, FAILED, {}, {}, "vLLM exited with status 2", "bad arg")
        return by_seqs(args, setup, workdir)

    study = open_study("s", storage, seed=0)
    run_study(study, spec, stand_in_setup(), tmp_path, 8, runner=runner)
    trials = load_trials(storage, "s")
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 8
    assert trials[0].user_attrs["engine_args"] == {
        "load-format": "dummy",
        "gpu-memory-utilization": 0.2,
    }
    failed = trials[1]
    assert failed.user_attrs["feasible"] is False
    assert failed.user_attrs["reason"] == "vLLM exited with status 2"
    assert failed.user_attrs["log_tail"] == "bad arg"
    assert failed.value == FAILED.value
    feasible = [t for t in trials if t.user_attrs["feasible"]]
    assert feasible and len(feasible) < 7  # some drew more than 16 sequences: errors
    best = best_trial(study)
    assert best is not None
    assert best.number == min(feasible, key=lambda t: t.value or 0).number
    assert best.value is not None
    assert best.value > min(t.value for t in trials if t.value is not None)


def test_study_loop_resumes_with_one_baseline(tmp_path: Path) -> None:
    spec = parse_spec(SPACE_SPEC)
    storage = f"sqlite:///{tmp_path / 's.db'}"
    run_study(open_study("s", storage, 0), spec, stand_in_setup(), tmp_path, 2, runner=by_seqs)
    run_study(open_study("s", storage, 0), spec, stand_in_setup(), tmp_path, 3, runner=by_seqs)
    trials = load_trials(storage, "s")
    assert [t.number for t in trials] == [0, 1, 2, 3, 4]
    assert [t.number for t in trials if t.user_attrs.get("baseline")] == [0]
    # The resumed sampler does not replay the first run's suggestions.
    seqs = [t.params["max-num-seqs"] for t in trials[1:]]
    assert seqs[1:3] != seqs[:2]


@pytest.mark.filterwarnings("ignore:Fixed parameter max-num-seqs with value 40 is out of range")
def test_candidates_follow_the_baseline_once_each_in_full(tmp_path: Path) -> None:
    spec = parse_spec(
        SPACE_SPEC
        | {
            "candidates": [
                {"max-num-seqs": 16, "block-size": 32},
                {"max-num-seqs": 40},
                {"block-size": 16},
            ]
        }
    )
    storage = f"sqlite:///{tmp_path / 's.db'}"
    offered: list[bool] = []

    def runner(args, setup, workdir, should_stop=None) -> TrialOutcome:
        offered.append(should_stop is not None)
        return by_seqs(args, setup, workdir)

    def interrupted(args, setup, workdir, should_stop=None) -> TrialOutcome:
        raise KeyboardInterrupt

    run_study(open_study("s", storage, 0), spec, stand_in_setup(), tmp_path, 2, runner=runner)
    with pytest.raises(KeyboardInterrupt):  # the second candidate is interrupted: run again
        run_study(
            open_study("s", storage, 0), spec, stand_in_setup(), tmp_path, 1, runner=interrupted
        )
    run_study(open_study("s", storage, 0), spec, stand_in_setup(), tmp_path, 4, runner=runner)
    trials = load_trials(storage, "s")
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 2 + [TrialState.FAIL] + [
        TrialState.COMPLETE
    ] * 4
    baseline, first, _, second, third, *searched = trials
    assert baseline.user_attrs["baseline"] is True
    fixed = {"load-format": "dummy"}
    assert first.user_attrs["engine_args"] == fixed | {"max-num-seqs": 16, "block-size": 32}
    assert first.params == {"max-num-seqs": 16} and first.user_attrs["candidate"] == 0
    # Outside the search space (1..32), kept as given: the sampler learns from it too.
    assert second.user_attrs["engine_args"] == fixed | {"max-num-seqs": 40}
    assert second.params == {"max-num-seqs": 40} and second.user_attrs["candidate"] == 1
    # Nothing of the search space: vLLM's default max-num-seqs, no parameter for the sampler.
    assert third.user_attrs["engine_args"] == fixed | {"block-size": 16}
    assert third.params == {} and third.user_attrs["candidate"] == 2
    assert all("candidate" not in t.user_attrs for t in searched)
    # Every trial reports its ratios (only searched ones may be stopped: tests/test_search.py).
    assert offered == [True] * 6


def test_study_loop_interrupted_marks_the_trial_failed(tmp_path: Path) -> None:
    spec = parse_spec(SPACE_SPEC)
    storage = f"sqlite:///{tmp_path / 's.db'}"

    def interrupted(args, setup, workdir, should_stop=None) -> TrialOutcome:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_study(
            open_study("s", storage, 0), spec, stand_in_setup(), tmp_path, 3, runner=interrupted
        )
    trials = load_trials(storage, "s")
    assert [t.state for t in trials] == [TrialState.FAIL]
    assert trials[0].user_attrs["reason"] == "interrupted: KeyboardInterrupt"
    # The baseline never finished, so the next run measures it first.
    run_study(open_study("s", storage, 0), spec, stand_in_setup(), tmp_path, 1, runner=by_seqs)
    trials = load_trials(storage, "s")
    assert trials[1].state == TrialState.COMPLETE
    assert trials[1].user_attrs["baseline"] is True
