"""``tuner trace from-prometheus`` against a real Prometheus scraping a real vLLM (CPU build).

The known trace has two phases (1 req/s for 30 s, then 3 req/s for 30 s) and log-normal
lengths: prompts of about 100 tokens, light enough that a slow 2-core CI machine (cpu-demo
prefilling 400 tokens/s) keeps up, for arrivals rebuilt from first tokens are only right while
TTFT stays short (with 320-token prompts a slow machine took 130 s to serve the 60 s);
outputs of about 70 tokens, so that requests run long enough for the running gauge, scraped
once a second, to average near 1 (with 25-token outputs it averaged 0.24 against 0.38 by
Little's law in one CI run: the sampling error of a mean that low).
After replaying it, the trace rebuilt from Prometheus must match it within:

- request count ±10 %: the counter is read at 5 s steps, so requests finishing within the
  last scrape interval (1 s) of the range may be missed, and Prometheus's range may start
  up to one scrape after the load;
- requests per phase ±25 % (about 8 requests of the 30 in the slow phase): each step's
  count is exact up to a scrape interval at its edges (3 requests at 3 req/s), requests are
  spread uniformly within their 5 s step, and first tokens are moved back by their step's
  mean TTFT, not each request's own (a slow machine's TTFTs spread over seconds within a
  step once it falls behind; one mean over the whole range put 39 requests in the fast
  phase's 79 on a 2-core machine beside two busy loops; from completions, moved back by the
  mean end-to-end latency, a loaded 2-core machine put 59 requests in the fast phase's 79:
  decoding 70 tokens spread completions over seconds);
- mean lengths ±3 %: the histograms carry the exact ``_sum`` and ``_count``, and the sampler
  solves for that mean; what is left is rounding to whole tokens and the count difference;
- the share of requests at or under every bucket bound within 3 percentage points: the
  bucket counts are exact, the sampler allocates them by largest remainder, and what is left
  is the rebuilt count differing from the true one;
- p50 and p90 between the lower bound of the bucket holding the true p(q-3) and the upper
  bound of the bucket holding the true p(q+3): the rank may move by those 3 points, and
  within a bucket (vLLM's go 1, 2, 5, 10, 20, 50, ...) a histogram says nothing more.

The pure parts (stratified sampling, arrivals from rates) are checked without any server;
TLS, basic auth and Prometheus' error answers against a real Prometheus serving HTTPS with a
self-signed certificate behind basic auth (its own ``--web.config.file``), scraping a small
exporter of vLLM's metric names (no vLLM).
"""

from __future__ import annotations

import base64
import dataclasses
import shutil
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import numpy as np
import pytest
from conftest import CPU_ENGINE_ARGS, run_tuner
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client import Histogram as PromHistogram

from tuner.cli.exits import EXIT_BAD_INPUT
from tuner.cli.main import main
from tuner.engine.local import free_port
from tuner.engine.process import Engine
from tuner.errors import InputError, TunerError
from tuner.load.http import ReplaySettings
from tuner.load.metrics import parse_scrape
from tuner.load.open_loop import replay_in_process
from tuner.traces.formats import load_trace
from tuner.traces.from_prometheus import (
    FIRST_TOKENS,
    SUCCESS,
    LengthHistogram,
    Scraped,
    arrivals_from_rate,
    rebuild,
    sample_lengths,
)
from tuner.traces.model import from_columns
from tuner.traces.prometheus import fetch, parse_time, rate_from_counters
from tuner.traces.prometheus_http import Access, read_access

STEP_S = 5.0
RANK_POINTS = 3  # percentile ranks: bucket shares survive up to rounding and the count error
TOKEN_BUCKETS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, np.inf]


def known_trace(seed: int = 7):
    rng = np.random.default_rng(seed)
    slow = np.cumsum(rng.exponential(1.0, 30))
    slow = slow[slow < 30]
    fast = 30 + np.cumsum(rng.exponential(1 / 3, 90))
    fast = fast[fast < 60]
    arrival_s = np.concatenate((slow, fast))
    n = len(arrival_s)
    inputs = np.clip(rng.lognormal(np.log(80), 0.7, n), 8, 1000).astype(int)
    outputs = np.clip(rng.lognormal(np.log(60), 0.6, n), 2, 300).astype(int)
    return from_columns(arrival_s, inputs, outputs, source="known")


def bucket_of(value: float) -> tuple[float, float]:
    upper = next(b for b in TOKEN_BUCKETS if value <= b)
    lower = max([0, *[b for b in TOKEN_BUCKETS if b < value]])
    return lower, upper


def histogram_of(values: np.ndarray) -> LengthHistogram:
    bounds = np.array(TOKEN_BUCKETS, dtype=float)
    cumulative = np.array([np.count_nonzero(values <= b) for b in bounds], dtype=float)
    return LengthHistogram(bounds, cumulative, float(values.sum()), float(len(values)))


def test_stratified_lengths_keep_mean_and_buckets():
    values = known_trace().input_tokens
    drawn = sample_lengths(histogram_of(values), len(values), np.random.default_rng(0))
    assert len(drawn) == len(values) and drawn.min() >= 1
    assert abs(drawn.mean() - values.mean()) / values.mean() < 0.03
    for q in (50, 90):
        lower, upper = bucket_of(np.percentile(values, q))
        assert lower <= np.percentile(drawn, q) <= upper


def test_arrivals_follow_rate_steps():
    rng = np.random.default_rng(1)
    times_s = np.arange(1, 13) * STEP_S
    rate_per_s = np.array([0.5] * 6 + [2.5] * 6)
    arrival_s = arrivals_from_rate(times_s, rate_per_s, STEP_S, rng)
    assert len(arrival_s) == round(6 * 2.5 + 6 * 12.5)
    assert np.count_nonzero(arrival_s < 30) == 15
    assert np.all(np.diff(arrival_s) >= 0) and arrival_s[0] >= 0


def test_rate_from_counters_loses_nothing_and_survives_resets():
    grid = [0.0, 5.0, 10.0, 15.0, 20.0]
    length = [(t, v) for t, v in zip(grid, [4, 9, 9, 2, 7], strict=True)]  # reset at 15 s
    abort = [(10.0, 1.0), (20.0, 3.0)]  # appears at 10 s, no sample at 15 s
    times_s, rate_per_s = rate_from_counters([length, abort], 5.0)
    assert times_s.tolist() == [5.0, 10.0, 15.0, 20.0]
    assert (rate_per_s * 5).tolist() == [5.0, 1.0, 2.0, 7.0]


def test_a_short_last_step_keeps_its_requests():
    """The range's end rarely falls on the grid: its counter value closes a shorter step."""
    samples = [(0.0, 0.0), (5.0, 5.0), (10.0, 10.0), (12.0, 16.0)]
    times_s, rate_per_s = rate_from_counters([samples], 5.0)
    assert times_s.tolist() == [5.0, 10.0, 12.0]
    assert rate_per_s.tolist() == [1.0, 1.0, 3.0]
    arrival_s = arrivals_from_rate(times_s, rate_per_s, 5.0, np.random.default_rng(0))
    assert len(arrival_s) == 16
    assert np.count_nonzero(arrival_s > 10.0) == 6 and arrival_s.max() <= 12.0


def test_rebuild_is_seeded_and_shifted_by_latency():
    hist = histogram_of(known_trace().output_tokens)
    scraped = Scraped(
        start_s=1000.0,
        end_s=1060.0,
        step_s=STEP_S,
        rate_times_s=1000.0 + np.arange(1, 13) * STEP_S,
        rate_per_s=np.full(12, 2.0),
        prompt=hist,
        generation=hist,
        running_times_s=1000.0 + np.arange(13) * STEP_S,
        running=np.full(13, 3.0),
        mean_lag_s=2.0,
    )
    one, two = rebuild(scraped, seed=3), rebuild(scraped, seed=3)
    assert len(one.trace) == 120
    assert np.array_equal(one.trace.arrival_s, two.trace.arrival_s)
    assert np.array_equal(one.trace.input_tokens, two.trace.input_tokens)
    assert f"rate of {FIRST_TOKENS} per 5 s step" in one.header[1]
    assert "the mean TTFT 2.000 s" in one.header[1]
    # Counted over (1000 s, 1060 s], moved back by 2 s: the first step's requests start the
    # trace before 1003 s, the last arrives by 1058 s.
    assert 1000.0 <= one.origin_s < 1003.0
    assert one.origin_s + one.trace.arrival_s.max() <= 1058.0
    completions = rebuild(dataclasses.replace(scraped, counter=SUCCESS), seed=3)
    assert np.array_equal(completions.trace.arrival_s, one.trace.arrival_s)
    assert f"rate of {SUCCESS} per 5 s step" in completions.header[1]
    assert "the mean e2e latency 2.000 s" in completions.header[1]


def test_each_step_moves_back_by_its_own_mean_lag():
    """A server falling behind: the first 30 s of first tokens lagged 0.5 s, the last 30 s
    lagged 12 s (their requests arrived 12 s earlier); steps without counts take the mean."""
    hist = histogram_of(known_trace().output_tokens)
    times_s = 1000.0 + np.arange(1, 13) * STEP_S
    lag_s = np.where(times_s <= 1030.0, 0.5, 12.0)
    lag_s[0] = np.nan
    scraped = Scraped(
        start_s=1000.0,
        end_s=1060.0,
        step_s=STEP_S,
        rate_times_s=times_s,
        rate_per_s=np.full(12, 2.0),
        prompt=hist,
        generation=hist,
        running_times_s=times_s,
        running=np.full(12, 3.0),
        mean_lag_s=6.25,
        lag_s=lag_s,
    )
    rebuilt = rebuild(scraped, seed=3)
    arrival_s = rebuilt.origin_s + rebuilt.trace.arrival_s
    counted_s = arrivals_from_rate(times_s, scraped.rate_per_s, STEP_S, np.random.default_rng(3))
    want = counted_s - np.select([counted_s < 1005.0, counted_s < 1030.0], [6.25, 0.5], 12.0)
    # Arrivals before the range's start are clipped to it.
    assert np.allclose(np.sort(arrival_s), np.sort(np.clip(want, 1000.0, None)))
    assert (
        "each step's mean TTFT (0.500 to 12.000 s; 6.250 s over the range)" in (rebuilt.header[1])
    )


# --- against real servers ----------------------------------------------------------------


def _start_prometheus(
    workdir: Path, target: str, tls: tuple[Path, Path] | None = None, guarded: bool = False
) -> tuple[subprocess.Popen[bytes], str]:
    """Prometheus scraping ``target`` every second; over HTTPS with ``tls`` (cert, key);
    ``guarded``: every request needs ``USER`` and ``PASSWORD`` (basic auth)."""
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.fail("the prometheus binary is missing; .ci/setup --tests installs it")
    config = workdir / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "scrape_configs:\n  - job_name: vllm\n"
        f"    static_configs:\n      - targets: ['{target}']\n"
    )
    port = free_port()
    command = [
        binary,
        f"--config.file={config}",
        f"--storage.tsdb.path={workdir / 'tsdb'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    web = ""
    if tls:
        web += f"tls_server_config:\n  cert_file: {tls[0]}\n  key_file: {tls[1]}\n"
    if guarded:
        web += f"basic_auth_users:\n  {USER}: '{PASSWORD_BCRYPT}'\n"
    if web:
        (workdir / "web.yml").write_text(web)
        command.append(f"--web.config.file={workdir / 'web.yml'}")
    with (workdir / "prometheus.log").open("wb") as log:  # the server keeps its own copy
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    url = f"{'https' if tls else 'http'}://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            ready = httpx.get(f"{url}/-/ready", timeout=2, verify=False, auth=CREDENTIALS)
            if ready.status_code == 200:
                return process, url
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    process.kill()
    pytest.fail("prometheus did not become ready")


@pytest.fixture(scope="module")
def scraped_run(tmp_path_factory, cpu_model):
    """Replay the known trace against vLLM while Prometheus scrapes it; Prometheus stays up."""
    workdir = tmp_path_factory.mktemp("prom")
    engine = Engine(
        str(cpu_model),
        {**CPU_ENGINE_ARGS, "gpu-memory-utilization": 0.2},
        workdir,
    )
    prometheus = None
    try:
        engine.start()
        engine.wait_healthy(300)
        settings = ReplaySettings(model=str(cpu_model), vocab_size=8192)
        # A production server is warm: the CPU build's first requests take seconds longer.
        replay_in_process(engine.base_url, known_trace(seed=1).take(0, 4).requests(), settings)
        prometheus, url = _start_prometheus(workdir, engine.base_url.removeprefix("http://"))
        time.sleep(3)  # a few scrapes before the load
        known = known_trace()
        start_s = time.time()
        result = replay_in_process(engine.base_url, known.requests(), settings)
        time.sleep(3)  # the last completions scraped
        end_s = time.time()
        engine.stop()
        yield known, result, url, start_s, end_s, workdir
    finally:
        engine.stop()
        if prometheus is not None:
            prometheus.terminate()
            prometheus.wait(timeout=30)


@pytest.mark.xdist_group("from-prometheus-scraped-run")
@pytest.mark.vllm
def test_rebuilt_trace_matches_known_trace(scraped_run):
    known, result, url, start_s, end_s, _ = scraped_run
    assert all(r.ok for r in result.results), [r.error for r in result.results if r.error][:3]
    scraped = fetch(url, start_s, end_s, STEP_S)
    assert scraped.counter == FIRST_TOKENS
    rebuilt = rebuild(scraped, seed=0)
    trace = rebuilt.trace
    assert abs(len(trace) - len(known)) <= 0.10 * len(known)

    # The phases, on the wall clock: when the replay sent each request.
    sent = start_s + np.array([r.sent_s for r in result.results])
    built = rebuilt.origin_s + trace.arrival_s
    for lo, hi in ((0, 30), (30, 60)):
        want = np.count_nonzero((sent >= start_s + lo) & (sent < start_s + hi))
        got = np.count_nonzero((built >= start_s + lo) & (built < start_s + hi))
        e2e_s = [r.e2e_s for r in result.results]
        assert abs(got - want) <= 0.25 * want, (lo, got, want, rebuilt.header[1], e2e_s)

    for column in ("input_tokens", "output_tokens"):
        true, built = getattr(known, column), getattr(trace, column)
        assert abs(built.mean() - true.mean()) <= 0.03 * true.mean(), column
        for bound in TOKEN_BUCKETS:
            share = np.mean(true <= bound)
            assert np.mean(built <= bound) == pytest.approx(share, abs=RANK_POINTS / 100)
        for q in (50, 90):
            lower = bucket_of(np.percentile(true, q - RANK_POINTS))[0]
            upper = bucket_of(np.percentile(true, q + RANK_POINTS))[1]
            assert lower <= np.percentile(built, q) <= upper, (column, q)

    # Concurrency: the mean of vllm:num_requests_running over the range against Little's law
    # on vLLM's own running time per request (request_inference_time_seconds, read by the
    # client from /metrics, not through Prometheus), within 35 %: the gauge is scraped once a
    # second and a mean near 1 over a minute has a sampling error near 15 %. (The client's own
    # e2e latency is not the yardstick: it adds the API server's time, during which a request is
    # not yet running.) Each sample is a 5 s step's mean of the gauge, so on a fast machine
    # (requests running 0.2 s at 3 req/s) every step can hold less than 1. The range runs until
    # the last request finished and 3 s more: a machine that falls behind serves past the
    # replay's minute (running 40 at once, 2400 s of running time, on a 2-core machine with
    # other work beside), and that time is inside the range too.
    inference = "vllm:request_inference_time_seconds"
    before, after = parse_scrape(result.metrics_before), parse_scrape(result.metrics_after)
    running_s = after.histograms[inference].sum - before.histograms[inference].sum
    covered_s = len(rebuilt.concurrency) * STEP_S
    assert running_s > 0 and rebuilt.concurrency.max() > 0
    mean = float(rebuilt.concurrency.mean())
    assert mean == pytest.approx(running_s / covered_s, rel=0.35), (mean, running_s / covered_s)


@pytest.mark.xdist_group("from-prometheus-scraped-run")
@pytest.mark.vllm
def test_cli_writes_a_canonical_trace_and_concurrency(scraped_run, tmp_path):
    known, _, url, start_s, end_s, _ = scraped_run
    out = tmp_path / "rebuilt.csv"
    done = run_tuner(
        "trace",
        "from-prometheus",
        "--url",
        url,
        "--start",
        str(start_s),
        "--end",
        str(end_s),
        "--step-s",
        str(STEP_S),
        "--out",
        out,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert out.read_text().startswith("# rebuilt by tuner from Prometheus")
    trace = load_trace(out)
    assert abs(len(trace) - len(known)) <= 0.10 * len(known)
    concurrency = out.with_suffix(".concurrency.csv")
    assert concurrency.exists()
    assert "timestamp,concurrency" in concurrency.read_text()


@pytest.mark.xdist_group("from-prometheus-scraped-run")
@pytest.mark.vllm
def test_unreachable_or_bad_selector_exit_cleanly(scraped_run, tmp_path):
    _, _, url, start_s, end_s, _ = scraped_run
    out = tmp_path / "x.csv"
    bad = run_tuner(
        "trace", "from-prometheus", "--url", url, "--start", str(start_s), "--end", str(end_s),
        "--selector", "job=", "--out", out, cwd=tmp_path,
    )  # fmt: skip
    assert bad.returncode == 2, bad.stderr
    assert not out.exists()
    down = run_tuner(
        "trace", "from-prometheus", "--url", f"http://127.0.0.1:{free_port()}",
        "--start", str(start_s), "--end", str(end_s), "--out", out, cwd=tmp_path,
    )  # fmt: skip
    assert down.returncode == 1 and "cannot reach Prometheus" in down.stderr
    assert not out.exists()


# --- TLS and Prometheus' answers, against a real Prometheus without vLLM --------------------

TLS_STEP_S = 2.0
TLS_REQUESTS = 16
USER = "tuner"
PASSWORD = "tuner-test-password"
CREDENTIALS = (USER, PASSWORD)
# PASSWORD's bcrypt hash at cost 4 (the lowest: Prometheus checks it on each request), made once
# with python -c "import bcrypt; print(bcrypt.hashpw(b'tuner-test-password',
# bcrypt.gensalt(rounds=4)).decode())" (bcrypt 5.0.0); the tests passing with PASSWORD and
# failing without it are the check that the two belong together.
PASSWORD_BCRYPT = "$2b$04$qBbXoy0UbPgqBtEfnZ8Y4uGZD0QNdY8bwopjlqoTNnO4i1rY7U4xW"


def _self_signed_certificate(workdir: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 signed by its own key: valid, but trusted by no one."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.fail("openssl is missing")
    cert, key = workdir / "cert.pem", workdir / "key.pem"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return cert, key


def _serve_metrics(registry: CollectorRegistry) -> ThreadingHTTPServer:
    """``/metrics`` in the text format vLLM serves, names with colons as they are.

    (prometheus_client's own server answers Prometheus in OpenMetrics, which writes
    ``vllm:x`` as ``vllm_x``.)
    """

    class Metrics(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = generate_latest(registry)
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _wait_for_scrapes(url: str, name: str, timeout_s: float = 60) -> None:
    """Until Prometheus has scraped ``name`` (it finds new targets only every few seconds)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        answer = httpx.get(
            f"{url}/api/v1/query", params={"query": name}, verify=False, auth=CREDENTIALS
        ).json()
        if answer["data"]["result"]:
            return
        time.sleep(0.5)
    pytest.fail(f"Prometheus did not scrape {name}")


@pytest.fixture(scope="module")
def guarded_prometheus(tmp_path_factory):
    """Prometheus over HTTPS (self-signed) behind basic auth, scraping vLLM's metric names
    from an exporter; yields its URL, the range and its certificate (its own CA).

    Two requests finish each second for 8 s; the range ends 4 s after the last, so that every
    one of the 16 is scraped and on the query grid.
    """
    workdir = tmp_path_factory.mktemp("tls")
    registry = CollectorRegistry()
    success = Counter("vllm:request_success", "finished", registry=registry)
    buckets = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000]
    prompt = PromHistogram("vllm:request_prompt_tokens", "p", buckets=buckets, registry=registry)
    generation = PromHistogram(
        "vllm:request_generation_tokens", "g", buckets=buckets, registry=registry
    )
    e2e = PromHistogram("vllm:e2e_request_latency_seconds", "e", registry=registry)
    Gauge("vllm:num_requests_running", "running", registry=registry).set(2)
    exporter = _serve_metrics(registry)
    target = f"127.0.0.1:{exporter.server_address[1]}"
    prometheus = None
    try:
        cert, key = _self_signed_certificate(workdir)
        prometheus, url = _start_prometheus(workdir, target, (cert, key), guarded=True)
        _wait_for_scrapes(url, "vllm:request_success_total")
        time.sleep(2)  # a few scrapes of the counter at 0 before the range starts
        start_s = time.time()
        for second in range(TLS_REQUESTS // 2):
            for tokens in (40 + second, 300 + second):
                prompt.observe(tokens)
                generation.observe(tokens // 10)
                e2e.observe(0.5)
                success.inc()
            time.sleep(1)
        end_s = start_s + 12.0
        time.sleep(max(end_s - time.time(), 0) + 1.5)
        yield url, start_s, end_s, cert
    finally:
        exporter.shutdown()
        if prometheus is not None:
            prometheus.terminate()
            prometheus.wait(timeout=30)


def _argv(url: str, start_s: float, end_s: float, out: Path, *options: str | Path) -> list[str]:
    """``tuner trace from-prometheus`` over the range, writing ``out``."""
    argv = ["trace", "from-prometheus", "--url", url, "--start", str(start_s)]
    argv += ["--end", str(end_s), "--step-s", str(TLS_STEP_S), "--out", str(out)]
    return argv + [str(option) for option in options]


def _password_file(folder: Path, password: str = PASSWORD) -> Path:
    path = folder / "password"
    path.write_text(password + "\n")  # as a secret file usually ends
    return path


@pytest.mark.xdist_group("from-prometheus-guarded-prometheus")
@pytest.mark.vllm
def test_tls_is_verified_unless_insecure(guarded_prometheus):
    url, start_s, end_s, cert = guarded_prometheus
    with pytest.raises(TunerError, match="--insecure") as refused:
        fetch(url, start_s, end_s, TLS_STEP_S, access=Access(basic_auth=CREDENTIALS))
    assert type(refused.value) is TunerError and "certificate" in str(refused.value)
    assert "--ca-file" in str(refused.value)
    for access in (
        Access(basic_auth=CREDENTIALS, insecure=True),
        Access(basic_auth=CREDENTIALS, ca_file=cert),
    ):
        scraped = fetch(url, start_s, end_s, TLS_STEP_S, access=access)
        assert round(float(scraped.rate_per_s.sum()) * TLS_STEP_S) == TLS_REQUESTS
        # increase() extrapolates to the range's ends: near, not equal to, the requests made.
        assert scraped.prompt.count == pytest.approx(TLS_REQUESTS, rel=0.25)
        # The exporter has no TTFT histogram: completions, moved back by the e2e latency.
        assert scraped.counter == SUCCESS
        assert scraped.mean_lag_s == pytest.approx(0.5)
        observed = scraped.lag_s[np.isfinite(scraped.lag_s)]
        assert len(scraped.lag_s) == len(scraped.rate_times_s) and len(observed)
        assert observed == pytest.approx(np.full(len(observed), 0.5))


@pytest.mark.xdist_group("from-prometheus-guarded-prometheus")
@pytest.mark.vllm
def test_cli_verifies_tls_and_insecure_or_ca_file_opts_out(guarded_prometheus, tmp_path):
    url, start_s, end_s, cert = guarded_prometheus
    out = tmp_path / "rebuilt.csv"
    auth = ["--basic-auth-user", USER, "--basic-auth-password-file", _password_file(tmp_path)]
    refused = run_tuner(*_argv(url, start_s, end_s, out, *auth), cwd=tmp_path)
    assert refused.returncode == 1, refused.stderr
    assert len(refused.stderr.splitlines()) == 1 and "--insecure" in refused.stderr
    assert not out.exists()
    for trust in (["--insecure"], ["--ca-file", cert]):
        done = run_tuner(*_argv(url, start_s, end_s, out, *auth, *trust), cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        assert done.stderr == ""  # --insecure asked for it: no warning per request
        assert len(load_trace(out)) == TLS_REQUESTS
        out.unlink()


@pytest.mark.xdist_group("from-prometheus-guarded-prometheus")
@pytest.mark.vllm
def test_basic_auth_is_needed_and_enough(guarded_prometheus, tmp_path):
    """Without credentials, or with a wrong password, a one-line error naming the options and
    exit 1; with the right ones, the trace; the password never appears in what is printed."""
    url, start_s, end_s, cert = guarded_prometheus
    out = tmp_path / "rebuilt.csv"
    trusted = _argv(url, start_s, end_s, out, "--ca-file", cert)
    wrong = _password_file(tmp_path, "not-the-password")
    for credentials, said in (
        ([], "it needs credentials"),
        (["--basic-auth-user", USER, "--basic-auth-password-file", wrong], "credentials given"),
    ):
        refused = run_tuner(*trusted, *credentials, cwd=tmp_path)
        assert refused.returncode == 1, refused.stderr
        assert refused.stderr.startswith(f"tuner: Prometheus at {url} answered HTTP 401")
        assert said in refused.stderr
        assert len(refused.stderr.splitlines()) == 1
        for option in ("--basic-auth-user", "--basic-auth-password-file", "--bearer-token-file"):
            assert option in refused.stderr
        assert "not-the-password" not in refused.stderr
        assert not out.exists()
    password = _password_file(tmp_path)
    done = run_tuner(
        *trusted, "--basic-auth-user", USER, "--basic-auth-password-file", password, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert len(load_trace(out)) == TLS_REQUESTS
    assert PASSWORD not in done.stdout + done.stderr


@pytest.mark.xdist_group("from-prometheus-guarded-prometheus")
@pytest.mark.vllm
def test_header_is_sent_with_every_query(guarded_prometheus, tmp_path):
    """Prometheus reads basic auth from the Authorization header: a real check that --header
    reaches it (Prometheus checks no bearer token, so --bearer-token-file is checked below as
    the header it becomes)."""
    url, start_s, end_s, cert = guarded_prometheus
    out = tmp_path / "rebuilt.csv"
    basic = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    done = run_tuner(
        *_argv(url, start_s, end_s, out, "--ca-file", cert),
        "--header", "X-Scope-OrgID: tenant-1", "--header", f"Authorization: Basic {basic}",
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert len(load_trace(out)) == TLS_REQUESTS


def test_bearer_token_file_becomes_the_authorization_header(tmp_path):
    token = tmp_path / "token"
    token.write_text("  s3cret-token\n")
    access = read_access([("X-Scope-OrgID", "a")], bearer_token_file=token)
    assert dict(access.headers) == {"X-Scope-OrgID": "a", "Authorization": "Bearer s3cret-token"}
    assert access.has_credentials and "s3cret" not in repr(access)


@pytest.mark.parametrize(
    ("options", "said"),
    [
        (["--header", "Authorization Bearer x"], "expected 'Name: value'"),
        (["--header", ": x"], "expected 'Name: value'"),
        (["--basic-auth-password-file", "{password}"], "needs --basic-auth-user"),
        (["--basic-auth-user", "u", "--basic-auth-password-file", "{missing}"], "cannot read"),
        (["--basic-auth-user", "u", "--basic-auth-password-file", "{empty}"], "is empty"),
        (["--bearer-token-file", "{missing}"], "cannot read --bearer-token-file"),
        (["--bearer-token-file", "{password}", "--basic-auth-user", "u"], "one way"),
        (["--bearer-token-file", "{password}", "--header", "authorization: x"], "one way"),
        (["--header", "X-A: 1", "--header", "x-a: 2"], "given twice"),
        (["--ca-file", "{missing}"], "does not exist"),
        (["--ca-file", "{password}"], "holds no usable certificate"),
        (["--ca-file", "{password}", "--insecure"], "contradict"),
        (["--start", "nan"], "not a time: 'nan'"),
        (["--step-s", "0"], "argument --step-s: must be a positive number, got '0'"),
        (["--step-s", "inf"], "argument --step-s: must be a positive number, got 'inf'"),
        (["--url", "http://"], "--url 'http://' names no host"),
        (["--url", "ftp://x"], "must start with http:// or https://"),
        (["--seed", "-1"], "argument --seed: must be a whole number >= 0, got '-1'"),
        (["--seed", "1.5"], "argument --seed: must be a whole number >= 0, got '1.5'"),
    ],
)
def test_bad_access_options_exit_2_before_any_query(tmp_path, capsys, options, said):
    """Checked before anything is sent (the URL's port is closed: a query would exit 1)."""
    files = {"password": _password_file(tmp_path), "missing": tmp_path / "missing"}
    files["empty"] = tmp_path / "empty"
    files["empty"].write_text("\n")
    options = [option.format(**files) for option in options]
    url = f"http://127.0.0.1:{free_port()}"
    try:
        code = main(_argv(url, 1000.0, 1100.0, tmp_path / "x.csv", *options))
    except SystemExit as exited:  # argparse's refusals
        code = exited.code
    assert code == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert said in err.splitlines()[-1] and "Traceback" not in err
    assert "Authorization Bearer x" not in err  # a malformed header may hold a secret


def test_times_are_finite():
    assert parse_time("1700000000.5") == 1700000000.5
    assert parse_time("2024-01-01T00:00:00") == 1704067200.0
    for text in ("nan", "inf", "-inf", "yesterday"):
        with pytest.raises(InputError, match="not a time"):
            parse_time(text)


@pytest.mark.xdist_group("from-prometheus-guarded-prometheus")
@pytest.mark.vllm
def test_prometheus_error_is_one_line_naming_it(guarded_prometheus, tmp_path):
    url, start_s, end_s, _ = guarded_prometheus
    access = Access(basic_auth=CREDENTIALS, insecure=True)
    with pytest.raises(InputError) as refused:
        fetch(url, start_s, end_s, TLS_STEP_S, selector="job=", access=access)
    message = str(refused.value)
    assert message.startswith(f"Prometheus at {url} refused the query: bad_data: ")
    assert "parse error" in message and "{" not in message and "\n" not in message
    auth = ["--basic-auth-user", USER, "--basic-auth-password-file", _password_file(tmp_path)]
    bad = run_tuner(
        *_argv(url, start_s, end_s, tmp_path / "x.csv", *auth, "--insecure"),
        "--selector", "job=", cwd=tmp_path,
    )  # fmt: skip
    assert bad.returncode == 2 and bad.stderr == f"tuner: {message}\n"


def test_unreachable_prometheus_is_a_tool_error():
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(TunerError, match=f"cannot reach Prometheus at {url}: ") as refused:
        fetch(url, 1000.0, 1100.0, 15.0)
    assert type(refused.value) is TunerError


@pytest.mark.xdist_group("from-prometheus-guarded-prometheus")
@pytest.mark.vllm
def test_an_answer_not_from_prometheus_api_is_a_tool_error(guarded_prometheus):
    url, start_s, end_s, _ = guarded_prometheus
    plain = url.replace("https://", "http://")
    with pytest.raises(TunerError, match="answered HTTP 400, not with its API's JSON") as refused:
        fetch(plain, start_s, end_s, TLS_STEP_S)
    assert type(refused.value) is TunerError and "HTTPS server" in str(refused.value)
