"""The engine process and one trial, against a stand-in server started the way vLLM is.

The stand-in is a small module run by the real ``ProcessLauncher`` (``python -m MODULE
--config FILE``, own process group), so start, health, failure, the group stop and a whole
``run_trial`` are exercised in about a second each. vLLM itself is in ``test_run_e2e.py``.
"""

from __future__ import annotations

import os
import signal
import textwrap
import threading
import time
from dataclasses import replace
from itertools import groupby
from pathlib import Path

import pytest

from tuner.cli.interrupts import lost_interrupts_delivered
from tuner.engine.launchers import EngineFailed, ProcessLauncher
from tuner.engine.local import first_error
from tuner.engine.process import Engine
from tuner.load.http import ReplaySettings
from tuner.study.measure.trial import (
    REPLAY,
    STARTING,
    STOPPING,
    WARMUP,
    Criteria,
    TrialProgress,
    TrialSetup,
    run_trial,
)
from tuner.traces.model import Request

FAKE_SERVER = textwrap.dedent(
    '''
    """A stand-in for vLLM's OpenAI server: /health, /metrics, streamed /v1/completions."""
    import json, os, signal, subprocess, sys, time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    import yaml

    config = yaml.safe_load(open(sys.argv[sys.argv.index("--config") + 1]))
    mode = os.environ.get("FAKE_MODE", "serve")
    print(f"fake vllm starting pid={os.getpid()}", config, flush=True)
    print("module:", __spec__.name, flush=True)
    print("multiproc method:", os.environ.get("VLLM_WORKER_MULTIPROC_METHOD"), flush=True)
    if mode == "exit":
        print("error: argument --bogus: invalid choice", flush=True)
        sys.exit(2)
    if mode == "crash":
        # As vLLM's processes log a failure that travels up from its worker.
        print("(Worker pid=2) ERROR [executor.py:1063] Traceback (most recent call last):")
        print("(Worker pid=2) ERROR [executor.py:1063] ValueError: no memory for kv")
        print("(EngineCore pid=1) ERROR [core.py:1510] RuntimeError: Worker failed with error")
        print("RuntimeError: Engine core initialization failed. See root cause above.", flush=True)
        sys.exit(1)
    if os.environ.get("FAKE_STUBBORN"):
        # Ignores SIGTERM, and so does a worker it starts (as vLLM's engine core might).
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        worker = subprocess.Popen(
            [sys.executable, "-c",
             "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"]
        )
        with open(os.environ["FAKE_WORKER_PID"], "w") as out:
            out.write(str(worker.pid))
    if mode == "hang":
        time.sleep(600)

    done = {"n": 0, "ttft_sum": 0.0}
    short = int(os.environ.get("FAKE_SHORT", "0"))

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def _send(self, code, body, kind="text/plain"):
            self.send_response(code)
            self.send_header("content-type", kind)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            if self.path == "/health":
                self._send(200, b"")
            elif self.path == "/metrics":
                n, ttft = done["n"], done["ttft_sum"]
                text = (
                    "# TYPE vllm:request_success_total counter\\n"
                    f"vllm:request_success_total{{model_name=\\"m\\"}} {n}\\n"
                    "# TYPE vllm:time_to_first_token_seconds histogram\\n"
                    f"vllm:time_to_first_token_seconds_bucket{{le=\\"+Inf\\"}} {n}\\n"
                    f"vllm:time_to_first_token_seconds_count {n}\\n"
                    f"vllm:time_to_first_token_seconds_sum {ttft}\\n"
                )
                self._send(200, text.encode())
            else:
                self._send(404, b"not found")

        def _chunk(self, data):
            line = b"data: " + data + b"\\n\\n"
            self.wfile.write(b"%x\\r\\n%s\\r\\n" % (len(line), line))
            self.wfile.flush()

        def do_POST(self):
            began = time.perf_counter()
            body = json.loads(self.rfile.read(int(self.headers["content-length"])))
            tokens = body["max_tokens"] - short
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            for i in range(tokens):
                if i == 0:
                    done["ttft_sum"] += time.perf_counter() - began
                choice = {"index": 0, "text": f" t{i}", "finish_reason": None}
                self._chunk(json.dumps({"choices": [choice]}).encode())
            usage = {"prompt_tokens": len(body["prompt"]), "completion_tokens": tokens}
            self._chunk(json.dumps({"choices": [], "usage": usage}).encode())
            self._chunk(b"[DONE]")
            self.wfile.write(b"0\\r\\n\\r\\n")
            done["n"] += 1

    ThreadingHTTPServer((config["host"], config["port"]), Handler).serve_forever()
    '''
)


@pytest.fixture
def fake(tmp_path: Path) -> dict[str, str]:
    """Environment that makes ``python -m fake_vllm`` importable, and ``fake_vllm_serve`` (the
    same server, standing in for ``vllm serve``); the modules are written here."""
    folder = tmp_path / "fake"
    folder.mkdir()
    (folder / "fake_vllm.py").write_text(FAKE_SERVER)
    (folder / "fake_vllm_serve.py").write_text(FAKE_SERVER)
    return {"PYTHONPATH": str(folder)}


LAUNCHER = ProcessLauncher(module="fake_vllm", serve_module="fake_vllm_serve")


def gone(pid: int) -> bool:
    """No such process, or only its zombie (reaped by whoever adopted it)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_healthy_server_and_stop(tmp_path, fake):
    engine = Engine("m", {"max-num-seqs": 4}, tmp_path / "t", launcher=LAUNCHER, env=fake)
    with engine:
        assert engine.wait_healthy(timeout_s=30, poll_s=0.05) < 30
        assert engine.alive()
        port = engine.handle.port
        assert engine.base_url == f"http://127.0.0.1:{port}"
        config = engine.config_path.read_text()
        assert config == f"model: m\nmax-num-seqs: 4\nhost: 127.0.0.1\nport: {port}\n"
    assert not engine.alive()
    assert engine.times.stop_s is not None
    assert "fake vllm starting" in engine.log_path.read_text()


@pytest.mark.parametrize("own", [None, "spawn"])
def test_engine_core_is_forked_unless_tuner_is_told_otherwise(tmp_path, fake, monkeypatch, own):
    """Servers get VLLM_WORKER_MULTIPROC_METHOD=fork, unless tuner's environment sets it."""
    if own is None:
        monkeypatch.delenv("VLLM_WORKER_MULTIPROC_METHOD", raising=False)
    else:
        monkeypatch.setenv("VLLM_WORKER_MULTIPROC_METHOD", own)
    engine = Engine("m", {}, tmp_path / "t", launcher=LAUNCHER, env=fake)
    with engine:
        engine.wait_healthy(timeout_s=30, poll_s=0.05)
    assert f"multiproc method: {own or 'fork'}" in engine.log_path.read_text()


@pytest.mark.parametrize(
    ("args", "module"),
    [
        ({"max-num-seqs": 4}, "fake_vllm"),
        # Only vLLM's serve command reads the API server count and data-parallel-size (its
        # default): one API server or several, the server runs as `vllm serve` does.
        ({"api-server-count": 2}, "fake_vllm_serve"),
        ({"api_server_count": 1}, "fake_vllm_serve"),
        ({"data-parallel-size": 2}, "fake_vllm_serve"),
    ],
)
def test_the_api_server_count_starts_the_server_as_vllm_serve(tmp_path, fake, args, module):
    engine = Engine("m", args, tmp_path / "t", launcher=LAUNCHER, env=fake)
    with engine:
        engine.wait_healthy(timeout_s=30, poll_s=0.05)
    assert f"module: {module}\n" in engine.log_path.read_text()


def test_rejected_argument_fails_with_the_log_tail(tmp_path, fake):
    engine = Engine("m", {"bogus": 1}, tmp_path / "t", launcher=LAUNCHER, env=fake)
    engine.env = {**fake, "FAKE_MODE": "exit"}
    with engine, pytest.raises(EngineFailed) as caught:
        engine.wait_healthy(timeout_s=30, poll_s=0.05)
    assert "exited with status 2" in caught.value.reason
    assert "invalid choice" in caught.value.log_tail


def test_a_crash_before_healthy_names_the_first_error_in_the_log(tmp_path, fake):
    engine = Engine("m", {}, tmp_path / "t", launcher=LAUNCHER, env={**fake, "FAKE_MODE": "crash"})
    with engine, pytest.raises(EngineFailed) as caught:
        engine.wait_healthy(timeout_s=30, poll_s=0.05)
    assert caught.value.reason == (
        "vLLM exited with status 1 before it was healthy (ValueError: no memory for kv)"
    )
    assert "Engine core initialization failed" in caught.value.log_tail


@pytest.mark.parametrize(
    ("log", "first"),
    [
        ("INFO started\nWARNING slow\n", None),
        (
            "Traceback:\ntorch.OutOfMemoryError: CUDA out of memory\nRuntimeError: x\n",
            "torch.OutOfMemoryError: CUDA out of memory",
        ),
        (
            "(APIServer pid=1) ERROR [x.py:1] OSError: models/m is not a folder\n",
            "OSError: models/m is not a folder",
        ),
        ("UserWarning: not an error\nKeyError: 'x'\n", "KeyError: 'x'"),
    ],
)
def test_first_error(tmp_path, log, first):
    path = tmp_path / "engine.log"
    path.write_text(log)
    assert first_error(path) == first
    assert first_error(tmp_path / "absent.log") is None


def test_never_healthy_fails_after_the_timeout(tmp_path, fake):
    engine = Engine("m", {}, tmp_path / "t", launcher=LAUNCHER, env={**fake, "FAKE_MODE": "hang"})
    began = time.monotonic()
    with engine, pytest.raises(EngineFailed, match="not healthy within 2 s"):
        engine.wait_healthy(timeout_s=2, poll_s=0.05)
    assert 2 <= time.monotonic() - began < 10


def stubborn_engine(tmp_path: Path, fake: dict[str, str]) -> tuple[Engine, int]:
    """A healthy server that ignores SIGTERM, as does a worker it started; and that pid."""
    worker_pid = tmp_path / "worker.pid"
    env = {**fake, "FAKE_STUBBORN": "1", "FAKE_WORKER_PID": str(worker_pid)}
    engine = Engine("m", {}, tmp_path / "t", launcher=LAUNCHER, env=env)
    engine.start()
    engine.wait_healthy(timeout_s=30, poll_s=0.05)
    return engine, int(worker_pid.read_text())


def wait_gone(pid: int, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not gone(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return gone(pid)


def test_stop_kills_the_whole_group_even_when_it_ignores_sigterm(tmp_path, fake):
    engine, worker = stubborn_engine(tmp_path, fake)
    assert os.getpgid(worker) == engine.handle.pid
    assert os.getsid(worker) == os.getsid(0)  # a group of tuner's session, not a session
    engine.stop(grace_s=0.5)
    assert not engine.alive()
    assert wait_gone(worker)


def test_a_second_interrupt_during_stop_waits_for_the_stop(tmp_path, fake):
    """Ctrl-C while a stop is under way is acted on after it: nothing is left running."""
    engine, worker = stubborn_engine(tmp_path, fake)
    server = engine.handle.pid
    previous = signal.getsignal(signal.SIGINT)
    try:
        threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
        began = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            engine.stop(grace_s=1.0)  # the server ignores SIGTERM: 1 s, then SIGKILL
        assert time.monotonic() - began >= 1.0  # raised after the stop, not 0.3 s into it
    finally:
        signal.signal(signal.SIGINT, previous)
    assert engine.times.stop_s is not None and gone(server)
    assert wait_gone(worker)


def setup_for(requests, env, slos=None) -> TrialSetup:
    slos = slos or {"ttft_p95_s": 5.0, "e2e_p99_s": 5.0}
    return TrialSetup(
        model="m",
        requests=requests,
        replay=ReplaySettings(model="m", vocab_size=100, gauge_interval_s=0.1),
        criteria=Criteria(slos=slos, weights={"e2e_p99_s": 1.0}),
        health_timeout_s=30,
        launcher=LAUNCHER,
        env=env,
        # Not the 5 ms a GPU host's client keeps to: on a 2-core machine busy with other work its
        # event loop ran 8 ms late and these trials were flagged. Whether tuner flags a client
        # that fell behind is tested in tests/test_spread.py, as conftest.cpu_spec says.
        client_tolerance_s=60.0,
    )


REQUESTS = [Request(0.05 * i, 8, 3 + i) for i in range(6)]


def test_trial_measures_and_scores(tmp_path, fake):
    outcome = run_trial({"max-num-seqs": 2}, setup_for(REQUESTS, fake), tmp_path / "t")
    assert outcome.feasible, outcome.reason
    assert outcome.reason is None
    assert outcome.metrics["requests_ok"] == 6
    assert outcome.metrics["error_rate"] == 0
    assert outcome.metrics["server_requests_succeeded"] == 6
    assert outcome.metrics["server_ttft_mean_s"] < outcome.metrics["ttft_mean_s"]
    assert outcome.metrics["throughput_output_tokens_per_s"] > 0
    assert {"engine_healthy_s", "window_s", "engine_stop_s", "trial_s"} <= set(outcome.timings)
    assert outcome.score.value == pytest.approx(outcome.metrics["e2e_p99_s"] / 5.0)


def test_trial_tells_its_phases_in_order(tmp_path, fake):
    told: list[TrialProgress] = []
    pids: list[tuple[int, int]] = []  # the pid, and how many phases had been told by then
    setup = replace(
        setup_for(REQUESTS, fake),
        warmup_requests=REQUESTS[:2],
        progress=told.append,
        on_engine_start=lambda server: pids.append((server.pid, len(told))),
    )
    outcome = run_trial({}, setup, tmp_path / "t")
    assert outcome.feasible, outcome.reason
    assert [phase for phase, _ in groupby(t.phase for t in told)] == [
        STARTING,
        WARMUP,
        REPLAY,
        STOPPING,
    ]
    # The server's pid, told once, as soon as its process has been started: while it starts.
    assert len(pids) == 1 and pids[0][0] > 0 and pids[0][0] != os.getpid()
    assert [t.phase for t in told[: pids[0][1]]] == [STARTING] * pids[0][1]
    warmup = next(t for t in told if t.phase == WARMUP)
    assert (warmup.total, warmup.sending_s) == (2, REQUESTS[1].arrival_s)
    replaying = [t for t in told if t.phase == REPLAY]
    assert replaying[0] == TrialProgress(REPLAY, sending_s=REQUESTS[-1].arrival_s, total=6)
    done = [t.done for t in replaying]
    assert done == sorted(done) and done[-1] <= 6


def test_failed_start_tells_starting_then_stopping(tmp_path, fake):
    told: list[TrialProgress] = []
    setup = replace(setup_for(REQUESTS, {**fake, "FAKE_MODE": "exit"}), progress=told.append)
    run_trial({}, setup, tmp_path / "t")
    assert [phase for phase, _ in groupby(t.phase for t in told)] == [STARTING, STOPPING]


def test_short_outputs_are_errors_and_infeasible(tmp_path, fake):
    outcome = run_trial({}, setup_for(REQUESTS, {**fake, "FAKE_SHORT": "1"}), tmp_path / "t")
    assert not outcome.feasible
    assert outcome.metrics["error_rate"] == 1.0
    assert "error rate 100%" in (outcome.reason or "")
    assert "short output: 2 of 3 tokens" in (outcome.reason or "")


def test_engine_that_fails_is_an_infeasible_outcome(tmp_path, fake):
    outcome = run_trial({}, setup_for(REQUESTS, {**fake, "FAKE_MODE": "exit"}), tmp_path / "t")
    assert not outcome.feasible
    assert outcome.metrics == {}
    assert "exited with status 2" in (outcome.reason or "")
    assert "invalid choice" in outcome.log_tail


def test_missed_slo_names_the_metric(tmp_path, fake):
    setup = setup_for(REQUESTS, fake, slos={"ttft_p95_s": 1e-9, "e2e_p99_s": 5.0})
    outcome = run_trial({}, setup, tmp_path / "t")
    assert not outcome.feasible
    assert (outcome.reason or "").startswith("SLO missed: ttft_p95_s ")


def test_interrupt_mid_trial_stops_the_server(tmp_path, fake):
    # Ctrl-C while the window replays: run_trial lets KeyboardInterrupt through, server stopped.
    slow = [Request(0.0, 8, 2), Request(30.0, 8, 2)]
    setup = setup_for(slow, fake)
    log_path = tmp_path / "t" / "engine.log"

    def interrupt_once_started() -> None:
        # Once the server has said its pid (a slow machine may take seconds to start it), and
        # the window has had time to begin: the alarm's handler raises in the main thread.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if log_path.exists() and "pid=" in log_path.read_text():
                break
            time.sleep(0.05)
        time.sleep(1.5)
        os.kill(os.getpid(), signal.SIGALRM)

    previous = signal.signal(signal.SIGALRM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt))
    interrupter = threading.Thread(target=interrupt_once_started, daemon=True)
    try:
        interrupter.start()
        # As ``tuner`` runs: an interrupt that lands in a finalizer (aiohttp's, seen here) is
        # raised again rather than lost.
        with pytest.raises(KeyboardInterrupt), lost_interrupts_delivered():
            run_trial({}, setup, tmp_path / "t")
    finally:
        interrupter.join()
        signal.signal(signal.SIGALRM, previous)
    log = (tmp_path / "t" / "engine.log").read_text()
    assert gone(int(log.split("pid=", 1)[1].split()[0]))
