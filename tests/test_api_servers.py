"""Several API server processes (``api-server-count``) on vLLM's CPU build.

Only ``vllm serve`` reads the count; tuner starts such a server as ``vllm serve`` does
(``tuner.engine.serve``), so a trial measures what the emitted YAML serves. Each test starts vLLM
once with two API servers and checks the process tree (vLLM names them ``VLLM::APIServer_N``),
that ``/metrics`` adds both servers' requests up, and that no process is left: after tuner's
stop (zygote launcher, a whole trial), and after tuner itself was killed (process launcher:
the parent-death signal stops ``vllm serve``, which stops its API servers and engine core).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import CPU_BASELINE, CPU_ENGINE_ARGS, MARKER, marked_processes, wait_for_no_processes

from tuner.engine.launchers import ZygoteLauncher
from tuner.load.http import ReplaySettings
from tuner.load.metrics import parse_scrape
from tuner.study.measure.trial import REPLAY, Criteria, TrialProgress, TrialSetup, run_trial
from tuner.traces.model import Request

TWO_API_SERVERS = {**CPU_ENGINE_ARGS, **CPU_BASELINE, "api-server-count": 2}
API_SERVER_TITLE = "VLLM::APIServer_"
# vLLM names its processes with setproctitle, which by default takes over the memory of the
# process's environment for the title: /proc/PID/environ then reads as NULs, and
# ``marked_processes`` would not see the engine core, its worker or the API servers. With
# SPT_NOENV the title takes the room of the command line only, and the environment stays.
KEEP_ENVIRON = {"SPT_NOENV": "1"}


def prometheus_files(tmp: Path) -> list[str]:
    """What is left of vLLM's Prometheus multiprocess folders (``counter_PID.db`` and the
    like), which ``vllm serve`` makes under the temporary folder and removes as it exits."""
    return sorted(str(path.relative_to(tmp)) for path in tmp.rglob("*.db"))


def api_servers(processes: list[str]) -> list[str]:
    """The API server processes among ``marked_processes``' lines."""
    return [line for line in processes if line.split(" ", 1)[1].startswith(API_SERVER_TITLE)]


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A folder for vLLM's TMPDIR whose path is short: ``vllm serve`` with several API servers
    binds its ZMQ sockets there (a 36-character name each), and a Unix socket's path holds at
    most 107 bytes, fewer than ``tmp_path`` leaves under pytest-xdist
    (``/tmp/pytest-of-root/pytest-30/popen-gw1/test_a_trial_with_two_api_ser0/tmp/...``)."""
    folder = Path(tempfile.mkdtemp(prefix="tuner-", dir="/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.vllm
def test_a_trial_with_two_api_servers_serves_and_leaves_no_process(
    tmp_path: Path, short_tmp: Path, cpu_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = f"api-servers-trial-{os.getpid()}-{time.time_ns()}"
    # The zygote, and so every server it forks, carries them.
    monkeypatch.setenv(MARKER, marker)
    monkeypatch.setenv("SPT_NOENV", KEEP_ENVIRON["SPT_NOENV"])
    tmp = short_tmp
    monkeypatch.setenv("TMPDIR", str(tmp))
    running: list[str] = []

    def look(progress: TrialProgress) -> None:
        if progress.phase == REPLAY and not running:
            running.extend(marked_processes(marker))

    requests = [Request(0.25 * i, 16 + i, 8) for i in range(12)]
    launcher = ZygoteLauncher(log=tmp_path / "launcher.log")
    setup = TrialSetup(
        model=str(cpu_model),
        requests=requests,
        replay=ReplaySettings(model=str(cpu_model), vocab_size=8192),
        criteria=Criteria(slos={"e2e_p99_s": 600.0}, weights={"e2e_p99_s": 1.0}),
        health_timeout_s=300,
        launcher=launcher,
        progress=look,
        # The CPU engine holds both cores for seconds; the client's lag is not tested here.
        client_tolerance_s=60.0,
    )
    try:
        outcome = run_trial(TWO_API_SERVERS, setup, tmp_path / "t")
    finally:
        launcher.close()
    log = (tmp_path / "t" / "engine.log").read_text(errors="replace")
    assert outcome.feasible, f"{outcome.reason}\n{log[-3000:]}"
    assert len(api_servers(running)) == 2, running
    assert "Started 2 API server processes" in log
    # Each API server counts the requests it served; /metrics (a Prometheus multiprocess
    # folder) adds them up.
    assert outcome.metrics["requests_ok"] == len(requests)
    assert outcome.metrics["server_requests_succeeded"] == len(requests)
    assert outcome.metrics["server_generation_tokens"] == 8 * len(requests)
    assert wait_for_no_processes(marker, timeout_s=30) == []
    assert prometheus_files(tmp) == []


TUNER_THAT_DIES = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    from tuner.engine.launchers import ProcessLauncher
    from tuner.engine.process import Engine

    work, model, args = Path(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
    engine = Engine(model, args, work / "t", launcher=ProcessLauncher())
    engine.start()
    engine.wait_healthy(timeout_s=300)
    print(engine.base_url, flush=True)
    time.sleep(900)
    """
)


@pytest.mark.vllm
def test_two_api_servers_do_not_outlive_a_killed_tuner(
    tmp_path: Path, short_tmp: Path, cpu_model: Path
) -> None:
    marker = f"api-servers-killed-{os.getpid()}-{time.time_ns()}"
    tmp = short_tmp
    tuner = subprocess.Popen(
        [sys.executable, "-c", TUNER_THAT_DIES, tmp_path, cpu_model, json.dumps(TWO_API_SERVERS)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, **KEEP_ENVIRON, MARKER: marker, "TMPDIR": str(tmp)},
    )
    try:
        assert tuner.stdout is not None
        base_url = tuner.stdout.readline().strip()
        log = tmp_path / "t" / "engine.log"
        assert base_url.startswith("http://"), log.read_text(errors="replace")[-3000:]
        assert len(api_servers(marked_processes(marker))) == 2, marked_processes(marker)
        with httpx.Client(base_url=base_url, timeout=120) as client:
            for n in range(6):
                body = {"model": str(cpu_model), "prompt": [5, 6, 7, 8 + n], "max_tokens": 4}
                answer = client.post("/v1/completions", json={**body, "ignore_eos": True})
                assert answer.status_code == 200, answer.text
            scrape = parse_scrape(client.get("/metrics").text)
        assert scrape.values["vllm:request_success_total"] == 6
        assert scrape.histograms["vllm:e2e_request_latency_seconds"].count == 6
        assert scrape.values["vllm:num_requests_running"] == 0
    finally:
        with tuner:  # its pipe closed once it has exited
            tuner.kill()
    assert wait_for_no_processes(marker, timeout_s=60) == []
    assert prometheus_files(tmp) == []
