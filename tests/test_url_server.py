"""A server someone else started, measured through its URL (``tuner.engine.url_server``).

The fast tests run the stand-in server (``tuner.testing.standin``) in a process of their own: the
handle's health, its loss once the server stops answering, a stop that leaves the server running,
a password in the URL never shown, and a whole trial on it. The slow test starts vLLM's CPU
build by hand, as a user would, and measures it with ``tuner run --server-url``.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path

import httpx
import pytest
from conftest import (
    CPU_BASELINE,
    CPU_ENGINE_ARGS,
    cpu_spec,
    one_completion,
    run_tuner,
    served,
    write_small_trace,
    write_spec,
)

from tuner.engine.handle import EngineFailed
from tuner.engine.launchers import Launch
from tuner.engine.local import free_port
from tuner.engine.url_server import UrlLauncher, UrlServer
from tuner.load.http import ReplaySettings
from tuner.study.measure.judge import Criteria
from tuner.study.measure.trial import TrialSetup, run_trial
from tuner.testing import start
from tuner.traces.model import Request


@pytest.fixture
def standin() -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """The stand-in in its own process, and its URL once it listens."""
    with start() as server:
        yield server.process, server.url


def never_asked(host: str, port: int) -> Sequence[str]:
    raise AssertionError("a server at a URL is started by nobody: no arguments are asked for")


def launch(tmp_path: Path) -> Launch:
    return Launch(never_asked, tmp_path / "engine.log")


def answers(url: str) -> bool:
    return httpx.get(f"{url}/health", timeout=5).status_code == 200


def test_a_server_at_a_url_is_healthy_and_its_stop_leaves_it_running(tmp_path, standin):
    process, url = standin
    server = UrlLauncher(url + "/").launch(launch(tmp_path))
    assert server.base_url == url
    assert 0 <= server.wait_healthy(timeout_s=10, poll_s=0.05) < 10
    assert server.alive() and server.lost() is None
    # Its log is not tuner's to read; nothing was written for it.
    mark = server.mark()
    assert server.log_since(mark) == server.log_tail() == ""
    server.stop()
    server.stop()
    assert process.poll() is None and answers(url)
    assert server.alive()
    assert list(tmp_path.iterdir()) == []


def test_a_server_that_stops_answering_is_lost(tmp_path, standin):
    process, url = standin
    server = UrlLauncher(url).launch(launch(tmp_path))
    server.wait_healthy(timeout_s=10, poll_s=0.05)
    process.terminate()
    process.wait()
    lost = server.lost()
    assert lost is not None and "stopped answering /health" in lost.reason
    assert not server.alive()


def test_a_url_that_does_not_answer_fails_the_launch_and_never_shows_its_password(tmp_path):
    url = f"http://tuner:s3cret@127.0.0.1:{free_port()}"
    with pytest.raises(EngineFailed) as caught:
        UrlLauncher(url).launch(launch(tmp_path))
    assert "does not answer /health" in caught.value.reason
    assert "s3cret" not in caught.value.reason and "tuner:***@" in caught.value.reason
    shown = url.replace("s3cret", "***")
    assert UrlServer(url).launched() == f"measuring the server at {shown} (not started by tuner)"


def test_a_trial_measures_the_server_at_a_url_and_leaves_it_running(tmp_path, standin):
    process, url = standin
    requests = [Request(0.05 * i, 8, 4) for i in range(10)]
    setup = TrialSetup(
        model="standin",
        requests=requests,
        replay=ReplaySettings(model="standin", vocab_size=1000, gauge_interval_s=0.1),
        criteria=Criteria(slos={"ttft_p95_s": 5.0, "e2e_p99_s": 5.0}, weights={"e2e_p99_s": 1}),
        health_timeout_s=10,
        launcher=UrlLauncher(url),
        client_tolerance_s=60.0,
    )
    outcome = run_trial({}, setup, tmp_path / "t")
    assert outcome.feasible, outcome.reason
    assert outcome.metrics["requests_ok"] == 10
    assert outcome.metrics["ttft_p95_s"] >= 0.02  # the stand-in's first token, 20 ms
    assert process.poll() is None and answers(url)
    assert not (tmp_path / "t" / "engine.yaml").exists()


def test_a_server_at_a_url_is_not_searched(tmp_path):
    trace = write_small_trace(tmp_path / "small.csv")
    result = run_tuner(
        "run", "--trace", trace, "--server-url", "http://127.0.0.1:1", "--n-trials", "3",
        cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "--n-trials does not apply" in result.stderr
    assert not (tmp_path / "studies").exists()


@pytest.mark.vllm
def test_tuner_measures_a_vllm_server_it_did_not_start_and_leaves_it_running(
    tmp_path: Path, tiny_model: Path
) -> None:
    """vLLM started by hand from its config; ``tuner run --server-url`` measures it once and
    writes no configuration; the server still serves afterwards."""
    model = str(tiny_model)
    config = tmp_path / "serve.yaml"
    engine = {**CPU_ENGINE_ARGS, **CPU_BASELINE}
    del engine["load-format"]  # the tiny model's saved weights
    write_spec(config, {"model": model, **engine})
    spec = write_spec(tmp_path / "spec.yaml", cpu_spec(tiny_model))
    trace = write_small_trace(tmp_path / "small.csv")
    with served(config, tmp_path) as url:
        result = run_tuner(
            "run", "--trace", trace, "--spec", spec, "--server-url", url, cwd=tmp_path
        )  # fmt: skip
        assert result.returncode == 0, result.stdout + result.stderr
        out = result.stdout
        assert f"server: {url}, not started by tuner" in out
        served_line = next(line for line in out.splitlines() if "requests served" in line)
        ok, _, sent = served_line.split(": ", 1)[1].split(" requests")[0].partition(" of ")
        assert int(ok) == int(sent) > 0, out
        started, finished = (line for line in out.splitlines() if line.startswith("trial   0"))
        assert f"measuring vLLM at {url} (not started by tuner) ..." in started, out
        ttft_ms = float(finished.split("ttft p95 ", 1)[1].split(" ms")[0])
        e2e_s = float(finished.split("e2e p99 ", 1)[1].split(" s")[0])
        assert ttft_ms > 0 and e2e_s > 0, out
        assert not (tmp_path / "configs").exists() or not list((tmp_path / "configs").iterdir())
        # tuner did not stop it: it still serves.
        assert answers(url)
        one_completion(url, model)
