"""The example app (``examples/translate_app``) tuned end to end on vLLM's CPU build.

``tuner run`` starts the app by its command for each trial, with the trial's engine arguments
as the app's engine-config file, replays its own endpoint (``POST /translate``, streamed as
server-sent events) and writes the winning engine arguments as that file; the app started with
the file written then answers. Two trials, about a minute of engine start each on two cores.
"""

from __future__ import annotations

import contextlib
import re
import shlex
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import optuna
import pytest
import yaml
from conftest import (
    CPU_ENGINE_ARGS,
    MARKER,
    REPO,
    cpu_spec,
    run_tuner,
    stop_group,
    wait_for_no_processes,
    write_spec,
)
from optuna.trial import FrozenTrial, TrialState

from tuner.cli.exits import MEETS_SLOS_EXITS
from tuner.engine.dummy_model import write_model
from tuner.engine.local import free_port
from tuner.load.metrics import SERVER_METRICS

APP = REPO / "examples" / "translate_app" / "app.py"
COMMAND = f"{sys.executable} {APP} --port {{port}} --engine-config {{config}}"
STUDY = "translate"


@dataclass
class Tuned:
    folder: Path
    result: subprocess.CompletedProcess[str]
    trials: list[FrozenTrial]
    left_behind: list[str]

    @property
    def config(self) -> Path:
        return self.folder / "configs" / f"{STUDY}.yaml"


@pytest.fixture(scope="module")
def tuned(tmp_path_factory: pytest.TempPathFactory) -> Tuned:
    """Two trials of the example app: its defaults, then one max-num-seqs from the search."""
    folder = tmp_path_factory.mktemp("own-server")
    model = write_model(folder / "cpu-tiny", "cpu-tiny")
    rows = "".join(f"{0.5 * i},{20 + 5 * i},{4 + i % 4}\n" for i in range(6))
    trace = folder / "trace.csv"
    trace.write_text("timestamp,input_tokens,output_tokens\n" + rows)
    slos = {"ttft_p95_s": 600.0, "e2e_p99_s": 900.0}
    server = {
        "command": COMMAND,
        "request": {
            "path": "/translate",
            "body": {
                "text": "{prompt}",
                "max_tokens": "{output_tokens}",
                "ignore_eos": True,
                "stream": True,
            },
            "stream": "sse",
            "output_tokens_field": "output_tokens",
        },
    }
    spec = cpu_spec(
        model,
        # The app's own default KV-cache share (AsyncEngineArgs': 0.92 of the machine) does not
        # fit beside other processes on a shared CI machine.
        engine_args={**CPU_ENGINE_ARGS, "gpu-memory-utilization": 0.2},
        baseline={},
        search_space={"max-num-seqs": {"type": "int", "low": 1, "high": 32}},
        slos=slos,
        weights={metric: 1.0 for metric in slos},
        window_s=3,
        time_scale=1,
        n_trials=2,
        server=server,
    )
    write_spec(folder / "spec.yaml", spec)
    marker = uuid.uuid4().hex
    storage = f"sqlite:///{folder / 'study.db'}"
    result = run_tuner(
        *("-v", "run", "--trace", trace, "--study", STUDY, "--spec", folder / "spec.yaml"),
        *("--storage", storage, "--configs", folder / "configs", "--runs", folder / "runs"),
        cwd=folder,
        env={MARKER: marker},
    )
    trials = optuna.load_study(study_name=STUDY, storage=storage).get_trials(deepcopy=False)
    return Tuned(folder, result, trials, wait_for_no_processes(marker))


@pytest.mark.xdist_group("own-server-e2e-tuned")
@pytest.mark.vllm
def test_trials_start_the_app_and_replay_its_endpoint(tuned: Tuned) -> None:
    assert tuned.result.returncode in MEETS_SLOS_EXITS, tuned.result.stderr[-3000:]
    assert f"server: {COMMAND} (POST /translate)" in tuned.result.stdout
    # Each trial's line names the app, not vLLM's server.
    assert re.search(
        r"^trial +1  .*  starting your server \(pid \d+\) \.\.\.$", tuned.result.stdout, re.M
    )
    assert "starting vLLM" not in tuned.result.stdout
    assert [t.state for t in tuned.trials] == [TrialState.COMPLETE] * 2
    for trial in tuned.trials:
        attrs = trial.user_attrs
        assert attrs["requests_ok"] == 6, attrs.get("reason")
        # Streamed: the first token seen; the app exposes vLLM's metrics, read as vLLM's are.
        assert attrs["ttft_p95_s"] > 0
        assert attrs[SERVER_METRICS] == 1.0 and attrs["server_requests_succeeded"] == 6
        folder = tuned.folder / "runs" / STUDY / f"trial-{trial.number:04d}"
        config = yaml.safe_load((folder / "engine-config.yaml").read_text())
        assert config["model"] == str(tuned.folder / "cpu-tiny")
        assert config["load_format"] == "dummy" and config["gpu_memory_utilization"] == 0.2
        assert ("max_num_seqs" in config) == ("max-num-seqs" in trial.params)
    assert tuned.left_behind == []


@pytest.fixture
def served(tuned: Tuned) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """The app started as the written file's header says, on a free port."""
    assert tuned.config.exists(), tuned.result.stderr[-3000:]
    header = tuned.config.read_text().splitlines()
    command = next(line for line in header if line.startswith("# Serve with: "))
    port = free_port()
    argv = shlex.split(command.removeprefix("# Serve with: "))
    argv[argv.index("--port") + 1] = str(port)
    argv[argv.index("--engine-config") + 1] = str(tuned.config)
    log = (tuned.folder / "serve.log").open("wb")
    server = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield f"http://127.0.0.1:{port}", server
    finally:
        stop_group(server)
        log.close()


@pytest.mark.xdist_group("own-server-e2e-tuned")
@pytest.mark.vllm
def test_the_app_started_with_the_written_file_answers(
    served: tuple[str, subprocess.Popen[bytes]], tuned: Tuned
) -> None:
    url, server = served
    written = yaml.safe_load(tuned.config.read_text())
    # The app's file: AsyncEngineArgs fields, the model's saved weights rather than random ones.
    assert "load_format" not in written and written["gpu_memory_utilization"] == 0.2
    deadline = time.monotonic() + 300
    with httpx.Client(base_url=url, timeout=60) as client:
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if client.get("/health").status_code == 200:
                    break
            if server.poll() is not None or time.monotonic() > deadline:
                log = (tuned.folder / "serve.log").read_text(errors="replace")
                pytest.fail(log[-3000:])
            time.sleep(0.5)
        answer = client.post("/translate", json={"text": "Bonjour", "max_tokens": 4})
    assert answer.status_code == 200, answer.text
    assert answer.json()["output_tokens"] > 0
