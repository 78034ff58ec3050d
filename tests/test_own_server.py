"""The user's own server: started by its command, asked through its request template, its
configuration written as the file it reads.

A small app (``FAKE_APP``, the standard library's HTTP server) reads the engine-config file tuner
writes and answers ``POST /generate`` as the template's ``stream`` says; the real
``CommandLauncher`` starts it and a whole ``run_trial`` measures it, in about a second each.
The example app on vLLM's CPU build: ``tests/test_own_server_e2e.py``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import SHIPPED_TRACE, run_tuner

from tuner.cli.spec import for_own_server
from tuner.engine.dummy_model import write_model
from tuner.engine.environment import Gpu
from tuner.engine.launchers import EngineFailed
from tuner.engine.local import LocalServer
from tuner.engine.own_server import CommandLauncher, ServerCommand
from tuner.errors import InputError, SpecError
from tuner.flags import MAX_CAPTURE_SIZE
from tuner.load.http import ReplaySettings
from tuner.load.metrics import SERVER_METRICS
from tuner.load.prompts import prompt_words
from tuner.load.template import RequestTemplate
from tuner.report.page import served_with
from tuner.study.measure.judge import Criteria, score
from tuner.study.measure.trial import TrialOutcome, TrialSetup, run_trial
from tuner.study.plan.space import capture_pin, gpu_search_space
from tuner.study.plan.spec import parse_spec
from tuner.study.result.emit import serve_command, served_config
from tuner.study.trials import fingerprint
from tuner.study.trials.search import open_study, run_study
from tuner.traces.model import Request

FAKE_APP = textwrap.dedent(
    '''
    """An app of its own: /ready, and POST /generate {"input": [...], "n": N, "mode": ...}."""
    import json, sys, time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    import yaml

    port, config = int(sys.argv[1]), yaml.safe_load(open(sys.argv[2]))
    print("engine config:", json.dumps(config), flush=True)
    if config.get("max_num_seqs") == 0:
        print("ValueError: max_num_seqs must be positive", flush=True)
        sys.exit(1)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def _whole(self, code, body):
            self.send_response(code)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            self._whole(200 if self.path == "/ready" else 404, b"")

        def _chunk(self, data):
            self.wfile.write(b"%x\\r\\n%s\\r\\n" % (len(data), data))
            self.wfile.flush()

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["content-length"])))
            n, mode = body["n"], body["mode"]
            if mode == "none":
                time.sleep(0.01 * n)
                answer = {"result": {"text": "x" * n, "tokens": n}, "seen": len(body["input"])}
                return self._whole(200, json.dumps(answer).encode())
            self.send_response(200)
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            for i in range(n):
                time.sleep(0.01)
                piece = json.dumps({"text": f"w{i}"}).encode()
                self._chunk(b"data: " + piece + b"\\n\\n" if mode == "sse" else piece + b"\\n")
            last = json.dumps({"result": {"tokens": n}}).encode()
            self._chunk(b"data: " + last + b"\\n\\n" if mode == "sse" else last + b"\\n")
            self.wfile.write(b"0\\r\\n\\r\\n")

    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
    '''
)

REQUESTS = [Request(0.05 * i, 8, 3 + i) for i in range(6)]


@pytest.fixture
def app(tmp_path: Path) -> ServerCommand:
    script = tmp_path / "app.py"
    script.write_text(FAKE_APP)
    return ServerCommand(f"{sys.executable} {script} {{port}} {{config}}", "/ready")


def template(stream: str, field: str | None = "result.tokens") -> RequestTemplate:
    body = {"input": "{prompt}", "n": "{output_tokens}", "mode": stream}
    return RequestTemplate("/generate", body, "token_ids", stream, field)


def setup_for(app: ServerCommand, request: RequestTemplate) -> TrialSetup:
    return TrialSetup(
        model="models/m",
        requests=REQUESTS,
        replay=ReplaySettings(model="m", vocab_size=100, exchange=request),
        criteria=Criteria({"e2e_p99_s": 5.0}, {"e2e_p99_s": 1.0}),
        health_timeout_s=30,
        launcher=CommandLauncher(),
        client_tolerance_s=60.0,
        server=app,
    )


@pytest.mark.parametrize("stream", ["none", "sse", "chunked"])
def test_a_trial_starts_the_app_with_its_engine_config_and_replays_its_endpoint(
    tmp_path: Path, app: ServerCommand, stream: str
) -> None:
    outcome = run_trial({"max-num-seqs": 4}, setup_for(app, template(stream)), tmp_path / "t")
    assert outcome.feasible, outcome.reason
    assert outcome.metrics["requests_ok"] == len(REQUESTS)
    assert outcome.metrics["e2e_p99_s"] > 0
    # TTFT where the response streams, none where it does not.
    assert ("ttft_p95_s" in outcome.metrics) == (stream != "none")
    # The app shows no vLLM metrics: the trial says so, and scores on the client's figures.
    assert outcome.metrics[SERVER_METRICS] == 0.0
    config = yaml.safe_load((tmp_path / "t" / "engine-config.yaml").read_text())
    assert config == {"model": "models/m", "max_num_seqs": 4}
    log = (tmp_path / "t" / "engine.log").read_text()
    assert 'engine config: {"model": "models/m", "max_num_seqs": 4}' in log


def test_a_replay_spread_over_client_processes_asks_the_app_the_same_way(
    tmp_path: Path, app: ServerCommand
) -> None:
    setup = setup_for(app, template("sse"))
    spread = replace(setup, replay=replace(setup.replay, client_procs=2))
    outcome = run_trial({}, spread, tmp_path / "t")
    assert outcome.feasible, outcome.reason
    assert outcome.metrics["client_procs"] == 2
    assert outcome.metrics["requests_ok"] == len(REQUESTS) and "ttft_p95_s" in outcome.metrics


def test_a_count_that_disagrees_with_the_output_length_fails_the_requests(
    tmp_path: Path, app: ServerCommand
) -> None:
    """Without ``output_tokens_field`` the events are counted, the app's closing count among
    them: one more than the output length, so every request fails, loudly."""
    outcome = run_trial({}, setup_for(app, template("sse", None)), tmp_path / "t")
    assert outcome.metrics["requests_failed"] == len(REQUESTS)
    assert "short output" in (outcome.reason or "")


def test_an_app_that_exits_is_an_infeasible_trial_with_its_error(
    tmp_path: Path, app: ServerCommand
) -> None:
    outcome = run_trial({"max-num-seqs": 0}, setup_for(app, template("sse")), tmp_path / "t")
    assert not outcome.feasible
    assert "ValueError: max_num_seqs must be positive" in (outcome.reason or "")


def test_an_app_stops_as_a_process_group(tmp_path: Path, app: ServerCommand) -> None:
    engine = app.engine("m", {}, tmp_path / "t", CommandLauncher(), {})
    server = engine.start()
    assert isinstance(server, LocalServer)
    try:
        engine.wait_healthy(30, poll_s=0.05)
    finally:
        engine.stop()
    assert gone(server.pid)


def test_an_app_that_never_answers_its_health_path_fails_its_start(tmp_path: Path) -> None:
    script = tmp_path / "app.py"
    script.write_text(FAKE_APP)
    elsewhere = ServerCommand(f"{sys.executable} {script} {{port}} {{config}}", "/health")
    engine = elsewhere.engine("m", {}, tmp_path / "t", CommandLauncher(), {})
    engine.start()
    try:
        with pytest.raises(EngineFailed, match=r"^your server was not healthy within 2 s"):
            engine.wait_healthy(2, poll_s=0.05)
    finally:
        engine.stop()


def test_the_body_gets_the_prompt_and_the_output_length() -> None:
    words = tuple(f" w{i}" for i in range(30))
    request = RequestTemplate(
        "/translate",
        {"text": "{prompt}", "max_tokens": "{output_tokens}", "note": "for {model}", "k": [1]},
        words=words,
    )
    settings = ReplaySettings(model="m", vocab_size=100)
    body = json.loads(request.payload(3, Request(0.0, 5, 7), settings))
    assert body["max_tokens"] == 7 and body["note"] == "for m" and body["k"] == [1]
    assert body["text"].count(" w") == 5
    ids = RequestTemplate("/g", {"ids": "{prompt}"}, "token_ids")
    assert len(json.loads(ids.payload(3, Request(0.0, 5, 7), settings))["ids"]) == 5


SERVER: dict[str, Any] = {
    "command": "python app.py --port {port} --engine-config {config}",
    "request": {
        "path": "/translate",
        "body": {"text": "{prompt}", "max_tokens": "{output_tokens}"},
        "output_tokens_field": "output_tokens",
    },
}


def spec(**overrides: Any) -> dict[str, Any]:
    return {"server": SERVER, "slos": {"e2e_p99_s": 9.0}, "weights": {"e2e_p99_s": 1.0}} | (
        overrides
    )


def test_a_spec_names_its_server_and_request() -> None:
    parsed = parse_spec(spec())
    assert parsed.server is not None and parsed.server.request is not None
    assert parsed.server.command.argv(5, "c.yaml")[-4:] == [
        "--port",
        "5",
        "--engine-config",
        "c.yaml",
    ]
    assert parsed.server.request.path == "/translate"
    assert parse_spec({}).server is None


def test_the_gpu_space_leaves_out_what_only_vllms_server_reads(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``tuner init`` on a GPU searches api-server-count first, which AsyncEngineArgs has no
    field for: a study of the app leaves it out of the search and says so, and refuses it where
    the spec sets it; a study of vLLM's server keeps it."""
    h100 = Gpu(0, "GPU-0", "NVIDIA H100", 81559)
    gpu = {"search_space": gpu_search_space([50, 100, 200], h100)}
    own = parse_spec(spec(**gpu))
    kept = for_own_server(own, Path("s.yaml"))
    names = [d.name for d in kept.space]
    assert "api-server-count" not in names and len(names) == len(own.space) - 1
    assert "api-server-count left out" in capsys.readouterr().out
    vllms = parse_spec(gpu)
    assert for_own_server(vllms, Path("s.yaml")) is vllms
    with pytest.raises(InputError, match=r"^s\.yaml: api-server-count: an argument of vLLM"):
        for_own_server(parse_spec(spec(candidates=[{"api_server_count": 2}])), Path("s.yaml"))


def test_the_search_starts_from_the_defaults_of_an_engine_built_from_engine_args(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """An app's ``AsyncLLM.from_engine_args`` takes 128 sequences and 2048 batched tokens where
    `vllm serve` takes 1024 and 8192 on an H100 (what the example app's engine logged on an
    H200): the study of the app starts from, pins at and is measured against the engine's."""
    h100 = Gpu(0, "GPU-0", "NVIDIA H100", 81559)
    gpu = {"search_space": gpu_search_space([500, 900, 1500], h100)}
    vllms = parse_spec(gpu)
    assert {k: vllms.vllm_defaults[k] for k in ("max-num-seqs", "max-num-batched-tokens")} == {
        "max-num-seqs": 1024,
        "max-num-batched-tokens": 8192,
    }
    own = for_own_server(parse_spec(spec(**gpu)), Path("s.yaml"))
    assert own.vllm_defaults == {
        MAX_CAPTURE_SIZE: 256,
        "max-num-seqs": 128,
        "max-num-batched-tokens": 2048,
        "gpu-memory-utilization": 0.9,
    }
    captures = next(d for d in own.space if d.name == MAX_CAPTURE_SIZE).choices
    assert 256 in captures and list(captures) == sorted(captures)
    out = capsys.readouterr().out
    assert "max-num-seqs 128 (was 1024), max-num-batched-tokens 2048 (was 8192)" in out
    # What vLLM's OpenAI server takes there is measured right after, as a candidate.
    server_values = {MAX_CAPTURE_SIZE: 512, "max-num-seqs": 1024, "max-num-batched-tokens": 8192}
    assert own.candidates == (server_values,)
    assert (
        "candidates: compilation-config.max_cudagraph_capture_size=512 max-num-seqs=1024 "
        "max-num-batched-tokens=8192 added, the values vLLM's OpenAI server takes" in out
    )
    given = for_own_server(parse_spec(spec(**gpu, candidates=[server_values])), Path("s.yaml"))
    assert given.candidates == (server_values,) and "candidates:" not in capsys.readouterr().out
    assert for_own_server(vllms, Path("s.yaml")) is vllms
    # Not searched, the capture range is pinned at the engine's own, not vLLM's server's.
    unsearched = replace(own, space=tuple(d for d in own.space if d.name != MAX_CAPTURE_SIZE))
    assert capture_pin(unsearched, cpu_build=False) == {MAX_CAPTURE_SIZE: 256}
    assert capture_pin(
        replace(vllms, space=tuple(d for d in vllms.space if d.name != MAX_CAPTURE_SIZE)),
        cpu_build=False,
    ) == {MAX_CAPTURE_SIZE: 512}
    # A spec already at the engine's defaults (vLLM's CPU build) is left as it is, unsaid.
    cpu = parse_spec(spec())
    assert for_own_server(cpu, Path("s.yaml")) is cpu
    assert capsys.readouterr().out == ""


def test_the_server_values_are_measured_after_the_apps_own_and_searched_from(
    tmp_path: Path,
) -> None:
    """Trial 0 is the app with no engine arguments, trial 1 vLLM's OpenAI server's values, and
    where those win the search moves from them: the capture range up from 512, not from 256."""
    h100 = Gpu(0, "GPU-0", "NVIDIA H100", 81559)
    gpu = {"search_space": gpu_search_space([50, 100, 200], h100), "n_trials": 3}
    own = for_own_server(parse_spec(spec(**gpu)), Path("s.yaml"))
    ran: list[dict[str, Any]] = []

    def runner(args, setup, workdir, should_stop=None) -> TrialOutcome:
        ran.append(dict(args))
        metrics = {"e2e_p99_s": 1.0 if args.get("max-num-seqs") == 1024 else 5.0}
        metrics["error_rate"] = 0.0
        result = score(metrics, Criteria({"e2e_p99_s": 9.0}, {"e2e_p99_s": 1.0}))
        return TrialOutcome(args, result, metrics, {})

    setup = TrialSetup(
        model="m",
        requests=(),
        replay=ReplaySettings(model="m", vocab_size=100),
        criteria=Criteria(slos={"e2e_p99_s": 9.0}, weights={"e2e_p99_s": 1.0}),
    )
    study = open_study("s", f"sqlite:///{tmp_path / 's.db'}", 0)
    run_study(study, own, setup, tmp_path, 3, runner=runner)
    assert ran[0] == {}
    assert ran[1] == {MAX_CAPTURE_SIZE: 512, "max-num-seqs": 1024, "max-num-batched-tokens": 8192}
    assert ran[2][MAX_CAPTURE_SIZE] == 1024
    assert ran[2]["max-num-seqs"] == 1024 and ran[2]["max-num-batched-tokens"] == 8192


@pytest.mark.parametrize(
    "overrides, field",
    [
        # A server that does not stream shows no first token: TTFT and TPOT are refused.
        ({"slos": {"ttft_p95_s": 1.0}, "weights": {"ttft_p95_s": 1.0}}, "slos.ttft_p95_s"),
        ({"slos": {"tpot_p95_s": 1.0, "e2e_p99_s": 9.0}}, "slos.tpot_p95_s"),
        ({"server": {**SERVER, "command": "python app.py --port {port}"}}, "server"),
        ({"server": {**SERVER, "request": {**SERVER["request"], "stream": "ws"}}},
         "server.request.stream"),
        ({"server": {**SERVER, "request": {"path": "/t", "body": {"text": "{prompt}"}}}},
         "server.request.output_tokens_field"),
        ({"server": {**SERVER, "request": {**SERVER["request"], "body": {"text": "hi"}}}},
         "server.request.body"),
    ],
)  # fmt: skip
def test_a_spec_server_that_cannot_be_measured_is_refused(
    overrides: dict[str, Any], field: str
) -> None:
    with pytest.raises(SpecError) as error:
        parse_spec(spec(**overrides))
    assert error.value.field == field
    assert "\n" not in str(error.value)


def test_a_streaming_server_may_be_held_to_ttft() -> None:
    streamed = {**SERVER, "request": {**SERVER["request"], "stream": "sse"}}
    slos = {"ttft_p95_s": 1.0}
    assert parse_spec(spec(server=streamed, slos=slos, weights=slos)).slos == slos


def test_the_written_configuration_is_the_file_the_app_reads() -> None:
    app = ServerCommand("python app.py --port {port} --engine-config {config}")
    args = {"max-num-seqs": 8, "load-format": "dummy", "compilation-config.mode": 0}
    text = served_config("org/model", args, app)
    assert yaml.safe_load(text) == {
        "model": "org/model",
        "max_num_seqs": 8,
        "compilation_config": {"mode": 0},
    }
    assert serve_command("out.yaml", app) == "python app.py --port 8000 --engine-config out.yaml"


def test_the_app_dies_with_a_tuner_that_is_killed(tmp_path: Path, app: ServerCommand) -> None:
    """tuner killed outright (no stop runs): the app it started goes too."""
    script = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from tuner.engine.own_server import CommandLauncher, ServerCommand\n"
        "app = ServerCommand(sys.argv[1], '/ready')\n"
        "engine = app.engine('m', {}, Path(sys.argv[2]), CommandLauncher(), {})\n"
        "engine.start()\n"
        "engine.wait_healthy(30, poll_s=0.05)\n"
        "print(engine.handle.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    tuner = subprocess.Popen(
        [sys.executable, "-c", script, app.command, str(tmp_path / "t")],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert tuner.stdout is not None
    with tuner:  # its pipe closed once it has exited
        pid = int(tuner.stdout.readline())
        os.kill(tuner.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while not gone(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gone(pid)


def gone(pid: int) -> bool:
    """No such process, or only its zombie (reaped by whoever adopted it)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_a_text_prompt_is_as_many_tokens_as_the_trace_says(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    model = write_model(tmp_path / "m", "cpu-tiny", weights=False)
    request = RequestTemplate("/t", {"text": "{prompt}"}, words=prompt_words(str(model)))
    settings = ReplaySettings(model="m", vocab_size=8192, block_tokens=16)
    tokenizer = AutoTokenizer.from_pretrained(model)
    for index, length in enumerate((1, 37, 500)):
        sent = Request(0.0, length, 4, hash_ids=(1, 2))
        text = json.loads(request.payload(index, sent, settings))["text"]
        assert len(tokenizer.encode(text, add_special_tokens=False)) == length


def test_the_report_serves_the_configuration_as_its_header_says() -> None:
    app = ServerCommand("python app.py --port {port} --engine-config {config}")
    header = f"# meets SLOs: yes\n# Serve with: {serve_command('<this file>', app)}\nmodel: m\n"
    command = served_with(header, "configs/s.yaml")
    assert command == "python app.py --port 8000 --engine-config configs/s.yaml"


def test_a_command_that_does_not_run_is_an_infeasible_trial(tmp_path: Path) -> None:
    missing = ServerCommand(f"{tmp_path / 'no-such-app'} {{port}} {{config}}")
    outcome = run_trial({}, setup_for(missing, template("sse")), tmp_path / "t")
    assert not outcome.feasible
    assert "the server command did not start" in (outcome.reason or "")


def test_a_study_of_the_app_is_not_resumed_as_one_of_vllms_server() -> None:
    workload = {"trace_sha256": "x"}
    own, plain = parse_spec(spec()), parse_spec({})
    assert "server" not in fingerprint.of_study(plain, workload, {})
    recorded = fingerprint.of_study(own, workload, {})["server"]
    assert recorded["request"]["path"] == "/translate" and "{port}" in recorded["command"]


def test_a_server_command_without_its_config_exits_2_and_writes_nothing(tmp_path: Path) -> None:
    command = "python app.py --port {port}"
    result = run_tuner("run", "--trace", SHIPPED_TRACE, "--server-command", command, cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        f"tuner: --server-command: the server command has no {{config}}: {command!r}"
    )
    assert list(tmp_path.iterdir()) == []
