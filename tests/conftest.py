"""Shared helpers: trace files written on the spot, study specs for the CPU build of vLLM.

The slow tier carries ``@pytest.mark.vllm``: tests that start vLLM (its CPU build, or the stand-in
server of ``stand_in_vllm`` under whole ``tuner run``s), PostgreSQL, Prometheus or Chromium, or
that wait out tens of seconds of real time (a capacity search's windows, a connect timeout).
``pytest -m "not vllm and not packaging"`` runs the fast tier; ``.ci/tiers`` runs each tier
and prints its seconds (``tests/ci_durations.py`` records them).
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import ipaddress
import os
import pwd
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from cap_load import CapLoad, measure_cap_load
from ci_durations import (  # noqa: F401 (pytest's hooks, recording the suite's durations)
    pytest_runtest_logreport,
    pytest_sessionfinish,
    pytest_sessionstart,
)

from tuner.engine.dummy_model import write_model
from tuner.engine.environment import command_to_serve
from tuner.engine.local import free_port
from tuner.testing import install_as_vllm

REPO = Path(__file__).resolve().parent.parent
SHIPPED_TRACE = REPO / "traces" / "azure-conv-peak.csv"
# Set to a fresh value in the environment of a ``tuner run``, which every process it starts
# inherits: "no process left behind" is then checked by scanning ``/proc`` for it.
MARKER = "TUNER_TEST_RUN"

# Engine arguments that make the CPU build start in about half a minute, and compute in
# float32: CPUs without bfloat16 instructions (AVX2 only, as on many CI machines) emulate the
# models' bfloat16, and prefill there several times slower.
CPU_ENGINE_ARGS = {
    "load-format": "dummy",
    "max-model-len": 4096,
    "enforce-eager": True,
    "dtype": "float32",
}
CPU_BASELINE = {"gpu-memory-utilization": 0.2}


@pytest.fixture(scope="session", autouse=True)
def ctrl_c_raises():
    """Ctrl-C raises KeyboardInterrupt here and in every process the tests start.

    A job that a shell without job control starts in the background (``cmd &`` in a script,
    ``nohup cmd &``) inherits SIGINT ignored, and Python then leaves it ignored: the tests of
    Ctrl-C would see none. A handler, unlike an ignored signal, is reset to the default by
    ``exec``, so the tuner processes the tests start get Python's own handler too.
    """
    previous = signal.getsignal(signal.SIGINT)
    if previous == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.fixture
def write_trace(tmp_path: Path):
    """Write ``text`` byte for byte (no newline translation) and return its path."""

    def write(text: str, name: str = "trace.csv") -> Path:
        path = tmp_path / name
        path.write_bytes(text.encode())
        return path

    return write


@pytest.fixture(scope="session")
def cpu_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The ``cpu-demo`` model folder without weights (tests of shapes: ``load-format: dummy``),
    written once per session."""
    return write_model(tmp_path_factory.mktemp("model") / "cpu-demo", "cpu-demo", weights=False)


def cpu_spec(model: Path, **overrides: Any) -> dict[str, Any]:
    """A study spec whose trials take about 50 s each on two CPU cores.

    The SLOs are loose: on a shared CI machine the point is to measure, not to miss them. The
    window's 19 prompts of 1,700 tokens on average queue behind each other's prefill: TTFT p95
    measured 118 to 136 s on a slow day of these 2-core machines (2026-11-24), hence 600 s.
    """
    spec: dict[str, Any] = {
        "model": str(model),
        "dummy_model": None,
        "engine_args": dict(CPU_ENGINE_ARGS),
        "baseline": dict(CPU_BASELINE),
        "search_space": {
            "max-num-seqs": {"type": "int", "low": 1, "high": 32},
            "gpu-memory-utilization": {"type": "float", "low": 0.1, "high": 0.25, "step": 0.05},
        },
        "slos": {"ttft_p95_s": 600.0, "tpot_p95_s": 5.0, "e2e_p99_s": 900.0},
        "weights": {"ttft_p95_s": 1.0, "tpot_p95_s": 1.0, "e2e_p99_s": 1.0},
        "window_s": 2,
        "time_scale": 4,
        "health_timeout_s": 300,
        "n_trials": 3,
        # Pruning is tested where it is written; here every trial runs its whole window.
        "prune_factor": 0,
        # Re-measuring the winner likewise (test_confirm, test_capacity): here n_trials is all.
        "confirm_top_k": 0,
        # vLLM's CPU engine holds every process of these two cores, tuner's client included, for
        # up to seconds (benchmarks/results/cpu-client-lag/); whether tuner flags a client
        # that fell behind is tested against a stand-in server (tests/test_spread.py).
        "client_tolerance_s": 60.0,
    }
    spec.update(overrides)
    return spec


def write_small_trace(path: Path) -> Path:
    """40 requests, one every 0.25 s (4 req/s over 10 s), prompts of 20 to 59 tokens and
    outputs of 10 to 49: a canonical CSV for tests that start no server."""
    rows = "".join(f"{0.25 * i},{20 + i},{10 + i}\n" for i in range(40))
    path.write_text("timestamp,input_tokens,output_tokens\n" + rows)
    return path


def write_spec(path: Path, spec: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def tuner_command(*args: object) -> list[str]:
    return [sys.executable, "-m", "tuner.cli", *map(str, args)]


def run_tuner(
    *args: object, cwd: Path, env: dict[str, str] | None = None, timeout_s: float = 900
) -> subprocess.CompletedProcess[str]:
    """``tuner ARGS`` as a subprocess, as a user would run it."""
    return subprocess.run(
        tuner_command(*args),
        cwd=cwd,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def marked_processes(marker: str) -> list[str]:
    """``pid cmdline`` of every live process whose environment carries ``MARKER=marker``."""
    needle = f"{MARKER}={marker}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue  # gone, or not ours
        if needle in environ.split(b"\0"):
            command = cmdline.replace(b"\0", b" ").decode(errors="replace")
            found.append(f"{entry.name} {command}")
    return found


def wait_for_no_processes(marker: str, timeout_s: float = 10.0) -> list[str]:
    deadline = time.monotonic() + timeout_s
    while (left := marked_processes(marker)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


@pytest.fixture(scope="session")
def stand_in_vllm(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Environment under which ``tuner run`` starts the stand-in server
    (``tuner.testing.standin``, vLLM's shape: ``--config FILE`` and the ``STAND_IN_*`` knobs) in
    place of vLLM: a ``vllm`` package holding only ``vllm.entrypoints.openai.api_server`` comes
    first on ``PYTHONPATH`` (``tuner.testing.install_as_vllm``)."""
    return install_as_vllm(tmp_path_factory.mktemp("stand-in"))


def listening_sockets(pids: list[int]) -> set[tuple[str, int]]:
    """``(address, port)`` of every TCP socket these processes listen on, IPv4 and IPv6."""
    listening: dict[str, tuple[str, int]] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as handle:
            next(handle)
            for line in handle:
                fields = line.split()
                if fields[3] != "0A":  # LISTEN
                    continue
                address, port = fields[1].split(":")
                listening[fields[9]] = (_address(address), int(port, 16))
    found = set()
    for pid in pids:
        try:
            links = [os.readlink(fd) for fd in Path(f"/proc/{pid}/fd").iterdir()]
        except OSError:
            continue  # gone
        for link in links:
            if link.startswith("socket:[") and link[8:-1] in listening:
                found.add(listening[link[8:-1]])
    return found


def _address(hexed: str) -> str:
    """An address as /proc/net/tcp{,6} writes it (32-bit words, each little-endian)."""
    raw = bytes.fromhex(hexed)
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    if len(words) == 4:
        return ".".join(str(b) for b in words)
    return str(ipaddress.IPv6Address(words))


def pg_binary(name: str) -> str | None:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return found[-1] if found else shutil.which(name)


@pytest.fixture(scope="module")
def postgres() -> Iterator[str]:
    """The URL of a fresh PostgreSQL server's ``postgres`` database, trusting local users.

    The server is the Debian package's (``.ci/setup --tests`` installs it), started in a temporary
    folder on 127.0.0.1 for the test module and stopped after; as root it runs as ``nobody``,
    since PostgreSQL refuses to run as root.
    """
    pytest.importorskip("psycopg")
    initdb, pg_ctl = pg_binary("initdb"), pg_binary("pg_ctl")
    if initdb is None or pg_ctl is None:
        pytest.skip("no PostgreSQL server (.ci/setup --tests installs Debian's postgresql)")
    folder = Path(tempfile.mkdtemp(prefix="tuner-pg-"))
    as_user: list[str] = []
    user = pwd.getpwuid(os.getuid()).pw_name
    if os.getuid() == 0:
        user = "nobody"
        os.chown(folder, pwd.getpwnam(user).pw_uid, -1)
        as_user = ["runuser", "-u", user, "--"]
    data, port = folder / "data", free_port()
    quiet: dict[str, Any] = {
        "stdout": subprocess.DEVNULL,
        "stderr": subprocess.STDOUT,
        "check": True,
    }
    subprocess.run([*as_user, initdb, "-A", "trust", "-U", user, "-D", str(data)], **quiet)
    options = f"-p {port} -k {folder} -c listen_addresses=127.0.0.1 -c max_connections=50"
    start = [*as_user, pg_ctl, "-D", str(data), "-l", str(folder / "log"), "-o", options]
    subprocess.run([*start, "-w", "start"], **quiet)
    try:
        yield f"postgresql://{user}@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run([*as_user, pg_ctl, "-D", str(data), "-m", "immediate", "stop"], **quiet)
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session")
def cap_load(tmp_path_factory: pytest.TempPathFactory) -> CapLoad:
    """The load of the capacity and goodput studies on vLLM's CPU build (``tests/cap_load.py``),
    measured once per test process: the tests that read it carry
    ``pytest.mark.xdist_group("cap-load")``, so ``--dist loadgroup`` runs them in one."""
    return measure_cap_load(tmp_path_factory.mktemp("cap-load"))


# The Hugging Face id under which ``hub_cache`` serves ``tiny_model`` offline.
HUB_MODEL_ID = "tuner-tests/cpu-tiny"


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The ``cpu-tiny`` model with saved weights (random values), written once per session."""
    return write_model(tmp_path_factory.mktemp("model") / "cpu-tiny", "cpu-tiny")


def lay_out_hub_cache(model: Path, hub: Path, repo_id: str) -> Path:
    """Lay ``model``'s files out in the cache folder ``hub`` (``HF_HOME/hub``) as huggingface_hub
    holds a download of ``repo_id`` at ``main``; return the snapshot folder.

    ``models--ORG--NAME/blobs`` holds each file once, named as the Hub's ETag names it (the
    sha256 of an LFS file, here the safetensors; the git blob sha1 of any other),
    ``snapshots/COMMIT/FILE`` links to ``../../blobs/BLOB`` and ``refs/main`` holds COMMIT.
    """
    repo = hub / ("models--" + repo_id.replace("/", "--"))
    (repo / "blobs").mkdir(parents=True)
    blobs = {}
    for path in sorted(p for p in model.iterdir() if p.is_file()):
        data = path.read_bytes()
        if path.suffix == ".safetensors":
            blob = hashlib.sha256(data).hexdigest()
        else:
            blob = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
        (repo / "blobs" / blob).write_bytes(data)
        blobs[path.name] = blob
    commit = hashlib.sha1(repr(sorted(blobs.items())).encode()).hexdigest()
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for name, blob in blobs.items():
        (snapshot / name).symlink_to(Path("..", "..", "blobs", blob))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    return snapshot


@pytest.fixture(scope="session")
def hub_cache(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Environment under which ``HUB_MODEL_ID`` is ``tiny_model`` from the Hugging Face cache,
    offline: ``HF_HOME`` (a fresh folder holding only that cache) and ``HF_HUB_OFFLINE=1``."""
    home = tmp_path_factory.mktemp("hf-home")
    lay_out_hub_cache(tiny_model, home / "hub", HUB_MODEL_ID)
    return {"HF_HOME": str(home), "HF_HUB_OFFLINE": "1"}


# How long a CPU server may take to answer /health (minutes on two busy cores).
SERVE_TIMEOUT_S = 600


def stop_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the server's process group, then SIGKILL to what is left after 30 s."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=30)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


@contextlib.contextmanager
def served(config: Path, cwd: Path, env: dict[str, str] | None = None) -> Iterator[str]:
    """The command tuner tells users to serve CONFIG with (``command_to_serve``: on vLLM's CPU
    build ``python -m vllm.entrypoints.openai.api_server --config CONFIG``), this interpreter's,
    started in ``cwd`` in a process group of its own; yields its URL once ``/health`` answers,
    stops the group after.
    """
    port = free_port()
    log = cwd / "serve.log"
    program, *rest = shlex.split(command_to_serve(str(config)))
    bin_dir = Path(sys.executable).parent
    command = [sys.executable if program == "python" else str(bin_dir / program), *rest]
    command += ["--port", str(port)]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            command,
            cwd=cwd,
            env={**os.environ, **(env or {})},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + SERVE_TIMEOUT_S
        while True:
            tail = "".join(log.read_text(errors="replace").splitlines(keepends=True)[-30:])
            assert proc.poll() is None, f"vLLM exited with {proc.returncode}:\n{tail}"
            assert time.monotonic() < deadline, f"no /health in {SERVE_TIMEOUT_S} s:\n{tail}"
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                    break
            time.sleep(1)
        yield url
    finally:
        stop_group(proc)


def one_completion(url: str, model: str) -> None:
    """The server names ``model`` and completes a text prompt (one token a byte) with the four
    tokens asked for."""
    models = httpx.get(f"{url}/v1/models", timeout=30).json()
    assert [m["id"] for m in models["data"]] == [model]
    body = {"model": model, "prompt": "Hello", "max_tokens": 4, "ignore_eos": True}
    response = httpx.post(f"{url}/v1/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert isinstance(answer["choices"][0]["text"], str)
    assert answer["usage"]["prompt_tokens"] == len("Hello")
    assert answer["usage"]["completion_tokens"] == 4
