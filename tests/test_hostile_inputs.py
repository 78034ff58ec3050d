"""Hostile inputs: each gets one clear line naming what is wrong, exit 2 (bad input) or 1 (the
tool's surroundings), and nothing half-written.

``tuner run`` is a subprocess, as a user runs it; where a trial must run, it starts the stand-in
server (``tuner.testing.standin``), so no test here starts vLLM. The engine-argument check asks the
installed vLLM's parser in a child process (about 8 s, once per vLLM version and machine).
"""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import REPO, cpu_spec, run_tuner, tuner_command, write_small_trace, write_spec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tuner.cli.exits import MEETS_SLOS_EXITS
from tuner.engine.environment import vllm_version
from tuner.errors import InputError, SpecError
from tuner.study.plan.spec import DEFAULT_SPEC, StudySpec, parse_spec
from tuner.study.plan.spec_file import MAX_SPEC_BYTES
from tuner.study.store.storage import CONNECT_TIMEOUT_S
from tuner.traces.formats import load_trace
from tuner.traces.table import MAX_SPAN_S
from tuner.urls import shown_url

VLLM = vllm_version()
CASES = yaml.safe_load((Path(__file__).parent / "data" / "hostile.yaml").read_text())
SECRET = "hunter2"
"""The password every case's URLs carry: it must appear in no output and no file."""
ALIAS_BOMB = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 10)}]\n" for i in range(8)
)


@pytest.fixture
def folder(tmp_path: Path, cpu_model: Path) -> Path:
    """A trace and a valid spec in ``tmp_path``, the working folder of the runs here."""
    write_small_trace(tmp_path / "trace.csv")
    write_spec(tmp_path / "spec.yaml", cpu_spec(cpu_model, window_s=2, time_scale=1, n_trials=1))
    return tmp_path


def tuner_run(folder: Path, *more: str | Path, env: dict[str, str] | None = None, **kw: Any):
    return run_tuner(
        "run", "--trace", folder / "trace.csv", "--study", "s", "--spec", folder / "spec.yaml",
        *more, cwd=folder, env=env, timeout_s=kw.get("timeout_s", 180),
    )  # fmt: skip


def files_in(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def assert_one_line(result: subprocess.CompletedProcess[str], code: int, *said: str) -> None:
    assert result.returncode == code, result.stdout + result.stderr
    assert result.stderr.startswith("tuner: ") and result.stderr.count("\n") == 1, result.stderr
    for words in said:
        assert words in result.stderr


SPEC_CASES = {
    "unknown-key": ({"windw_s": 5}, "spec.yaml: windw_s: unknown field"),
    "wrong-type": ({"window_s": "ten"}, "spec.yaml: window_s: must be a number, got 'ten'"),
    "negative": ({"n_trials": -3}, "n_trials: must be a whole number from 1 to 100000, got -3"),
    "absurd-window": ({"window_s": 1e12}, "window_s: 1000000000000.0 is beyond any sensible"),
    "absurd-bound": (
        {"search_space": {"max-num-seqs": {"type": "int", "low": 1, "high": 1e300}}},
        "search_space.max-num-seqs.high: 1e+300 is beyond any sensible value",
    ),
    "nan-slo": ({"slos": {"ttft_p95_s": math.nan}}, "slos.ttft_p95_s: must be a number, got nan"),
    "list-choice": (
        {"search_space": {"block-size": {"type": "categorical", "choices": [[16]]}}},
        "search_space.block-size.choices: must be numbers, strings, booleans or null",
    ),
    "no-such-engine-argument": (
        {"engine_args": {"max-num-seqz": 4}},
        f"spec.yaml: max-num-seqz: not an engine argument of vLLM {VLLM} "
        "(did you mean max-num-seqs",
    ),
}


@pytest.mark.parametrize(("change", "said"), SPEC_CASES.values(), ids=SPEC_CASES)
def test_a_bad_spec_exits_2_naming_the_field_and_writes_nothing(
    folder: Path, change: dict[str, Any], said: str
) -> None:
    """Refused before any trial; the engine-argument check asks the installed vLLM."""
    spec = yaml.safe_load((folder / "spec.yaml").read_text())
    write_spec(folder / "spec.yaml", {**spec, **change})
    before = files_in(folder)
    result = tuner_run(folder)
    assert_one_line(result, 2, said)
    assert files_in(folder) == before


YAML_CASES = {
    "python-tag": ("model: !!python/object/apply:os.system ['touch pwned']\n", "<yaml>"),
    "alias-bomb": (ALIAS_BOMB, "<yaml>: expands to more than 100000 values"),
    "self-alias": ("a: &a [*a]\n", "<yaml>"),
    "not-utf8": ("model: caf\udce9\n", "<file>: not UTF-8 text"),
    "not-a-mapping": ("- just\n- a list\n", "<top level>: must be a mapping, got list"),
}


@pytest.mark.parametrize(("text", "said"), YAML_CASES.values(), ids=YAML_CASES)
def test_yaml_that_safe_load_refuses_or_that_explodes_exits_2(
    folder: Path, text: str, said: str
) -> None:
    (folder / "spec.yaml").write_bytes(text.encode(errors="surrogateescape"))
    before = files_in(folder)
    assert_one_line(tuner_run(folder), 2, f"spec.yaml: {said}")
    assert files_in(folder) == before
    assert not (folder / "pwned").exists()


def test_a_100_mb_spec_is_refused_unread(folder: Path) -> None:
    with (folder / "spec.yaml").open("wb") as handle:
        handle.write(b"model: m\n# " + b"x" * (100 << 20) + b"\n")
    result = tuner_run(folder)
    assert_one_line(result, 2, f"spec.yaml: <file>: larger than {MAX_SPEC_BYTES >> 20} MiB")


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A port on 127.0.0.1 that accepts connections and never says a word."""
    listener = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield listener.getsockname()[1]
    stop.set()
    thread.join()
    for conn in accepted:
        conn.close()
    listener.close()


@pytest.mark.vllm
def test_a_storage_server_that_never_answers_exits_1_after_the_timeout(
    folder: Path, silent_server: int
) -> None:
    pytest.importorskip("psycopg")
    url = f"postgresql://tuner:hunter2@127.0.0.1:{silent_server}/s"
    result = tuner_run(
        folder, "--storage", url, "--n-trials", "0", timeout_s=CONNECT_TIMEOUT_S + 60
    )
    shown = f"postgresql://tuner:***@127.0.0.1:{silent_server}/s"
    assert_one_line(result, 1, f"cannot open the study storage {shown}: ", "timeout expired")
    assert "hunter2" not in result.stdout + result.stderr


def test_an_output_folder_that_cannot_be_made_exits_2_before_any_trial(folder: Path) -> None:
    (folder / "a-file").write_text("")
    before = files_in(folder)
    result = tuner_run(folder, "--configs", folder / "a-file" / "configs")
    assert_one_line(
        result, 2, f"--configs {folder}/a-file/configs: {folder}/a-file is not a folder"
    )
    assert files_in(folder) == before


@pytest.mark.vllm
def test_a_disk_that_fills_while_writing_the_yaml_leaves_the_old_file(
    folder: Path, stand_in_vllm: dict[str, str]
) -> None:
    """A study of one trial (on the stand-in), then ``--n-trials 0`` writing its YAML into a
    tmpfs of two pages that an older YAML and a filler file have filled: exit 1, one line, the
    older YAML as it was and no temporary file."""
    full = folder / "full"
    full.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=8k", "tmpfs", str(full)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        storage = f"sqlite:///{folder / 's.db'}"
        first = tuner_run(folder, "--storage", storage, env=stand_in_vllm)
        assert first.returncode in MEETS_SLOS_EXITS, first.stderr
        (full / "s.yaml").write_text("# the configuration written before\n")
        with (full / "filler").open("wb", buffering=0) as filler, pytest.raises(OSError):
            while True:
                filler.write(b"x" * 512)
        result = tuner_run(folder, "--storage", storage, "--n-trials", "0", "--configs", full)
        assert_one_line(
            result,
            1,
            f"tuner: cannot write {full}/s.yaml: No space left on device; it is left as it was; "
            "the study keeps every trial: --n-trials 0 writes the file again",
        )
        assert (full / "s.yaml").read_text() == "# the configuration written before\n"
        assert sorted(p.name for p in full.iterdir()) == ["filler", "s.yaml"]
    finally:
        subprocess.run(["umount", str(full)], check=True)


# Any document: a spec, or a SpecError naming the file and a field; nothing else escapes.

SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
FIELDS = st.sampled_from([*DEFAULT_SPEC, "search_space.max-num-seqs", "unknown"])


@st.composite
def spec_documents(draw: st.DrawFn) -> Any:
    """A spec with some fields replaced by anything, or anything at all."""
    if draw(st.booleans()):
        return draw(VALUES)
    document: dict[str, Any] = yaml.safe_load(yaml.safe_dump(DEFAULT_SPEC))
    for field in draw(st.lists(FIELDS, max_size=4)):
        head, _, rest = field.partition(".")
        if rest:
            document[head] = {rest: draw(VALUES)}
        else:
            document[head] = draw(VALUES)
    return document


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec_documents())
def test_any_spec_document_parses_or_names_its_field(document: Any) -> None:
    try:
        spec = parse_spec(document, "s.yaml")
    except SpecError as exc:
        assert str(exc).startswith(f"s.yaml: {exc.field}: ")
        assert exc.field and "\n" not in str(exc)
        return
    assert isinstance(spec, StudySpec)
    assert 1 <= spec.n_trials <= 100_000 and 0 < spec.window_s <= 86400


@pytest.mark.vllm
def test_the_engine_argument_check_is_skipped_where_vllm_cannot_say(
    folder: Path, stand_in_vllm: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The stand-in has no argument parser: with no answer cached, the names go unchecked and
    the trial runs (vLLM would refuse a bad one: an infeasible trial)."""
    env = {**stand_in_vllm, "XDG_CACHE_HOME": str(tmp_path_factory.mktemp("cache"))}
    result = run_tuner(
        "-v", "run", "--trace", folder / "trace.csv", "--study", "s", "--spec",
        folder / "spec.yaml", cwd=folder, env=env, timeout_s=180,
    )  # fmt: skip
    assert result.returncode in MEETS_SLOS_EXITS, result.stderr
    said = f"could not ask vLLM {VLLM} for its engine arguments; not checked"
    assert said in result.stderr
    assert os.listdir(env["XDG_CACHE_HOME"]) == []


# The hostile-input suite: each case of tests/data/hostile.yaml is a command, its exit code, the
# first line said and the input files it brings (``files``, their text; ``utf16`` those written
# in UTF-16). A case runs in a folder of its files, with the 40-request trace.csv where it
# brings none, offline from the model hub. An input too large to keep in the tree is written by
# the test: the case's ``made`` names it, and ``MADE`` how to make it.


def big_mooncake(path: Path) -> Path:
    """Two Mooncake records of 20,000 hash ids each: the first line is over 64 KiB (269,041
    bytes in all)."""
    records = (
        {
            "timestamp": 1000 * i,
            "input_length": 10240,
            "output_length": 8,
            "hash_ids": list(range(20000 * i, 20000 * (i + 1))),
        }
        for i in range(2)
    )
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return path


MADE = {"big.jsonl": big_mooncake}


def write_inputs(case: dict[str, Any], work: Path) -> None:
    """The case's input files in ``work``: as its text, or UTF-16 (little-endian, after a byte
    order mark) where ``utf16`` names the file; then those it ``made``."""
    for name, text in case.get("files", {}).items():
        path = work / name
        path.parent.mkdir(parents=True, exist_ok=True)
        utf16 = name in case.get("utf16", [])
        path.write_bytes(("\ufeff" + text).encode("utf-16-le") if utf16 else text.encode())
    for name in case.get("made", []):
        MADE[name](work / name)


@pytest.mark.parametrize("case", sorted(CASES), ids=str)
def test_a_hostile_case_says_its_line_exits_its_code_and_writes_nothing(
    case: str, tmp_path: Path
) -> None:
    expected = CASES[case]
    work = tmp_path / "work" / "here"
    work.mkdir(parents=True)
    write_inputs(expected, work)
    if not (work / "trace.csv").exists():
        write_small_trace(work / "trace.csv")
    before = files_in(tmp_path)
    stdin = (work / expected["stdin"]).read_bytes() if "stdin" in expected else b""
    result = subprocess.run(
        tuner_command(*expected["command"]),
        cwd=work,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        input=stdin,
        capture_output=True,
        timeout=180,
    )
    said = (result.stderr if expected["exit"] else result.stdout).decode()
    first = expected["first_line"].format(vllm=VLLM, cwd=work)
    assert result.returncode == expected["exit"], result.stdout + result.stderr
    assert said.splitlines()[0].startswith(first), said
    if expected["exit"]:
        assert said.count("\n") == 1, said
    assert files_in(tmp_path) == before
    assert SECRET.encode() not in result.stdout + result.stderr


def test_a_trace_from_a_pipe_or_a_fifo_is_the_file_s_requests(tmp_path: Path) -> None:
    """``cat trace | tuner trace inspect -`` and a FIFO read every request the file holds."""
    shipped = REPO / "traces" / "azure-conv-peak.csv"
    mooncake = big_mooncake(tmp_path / "big.jsonl")
    assert len(mooncake.read_text().splitlines()[0]) > 64 << 10
    for trace in (shipped, mooncake):
        figures = []
        fifo = tmp_path / f"{trace.stem}.fifo"
        os.mkfifo(fifo)
        writer = subprocess.Popen(["cp", trace, fifo])
        for source, stdin in ((trace, None), ("-", trace.read_bytes()), (fifo, None)):
            command = tuner_command("trace", "inspect", source, "--no-png", "--json")
            done = subprocess.run(command, input=stdin, capture_output=True, timeout=120)
            assert done.returncode == 0, done.stderr
            figures.append(json.loads(done.stdout) | {"source": None})
        writer.wait(timeout=30)
        assert figures[0]["requests"] == len(load_trace(trace)) > 1
        assert figures[1] == figures[0] == figures[2]


def test_output_closed_early_is_one_line_and_exit_1(tmp_path: Path) -> None:
    """``tuner trace inspect ... | head -0``: no traceback, a line, exit 1."""
    trace = write_small_trace(tmp_path / "trace.csv")
    read, write = os.pipe()
    os.close(read)
    done = subprocess.run(
        tuner_command("trace", "inspect", trace, "--no-png"),
        stdout=write,
        stderr=subprocess.PIPE,
        text=True,
        timeout=120,
    )
    os.close(write)
    assert done.returncode == 1
    assert done.stderr == "tuner: the output was closed before it ended (broken pipe)\n"


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (
            "postgresql+psycopg://tuner:hunter2@db:5432/s",
            "postgresql+psycopg://tuner:***@db:5432/s",
        ),
        ("http://user:hunter2@prom:9090/", "http://user:***@prom:9090/"),
        ("https://prom/?token=hunter2&x=1", "https://prom/?token=***&x=1"),
        ("postgresql://u:hunter2@db:notaport/s", "postgresql://u:***@db:notaport/s"),
        ("sqlite:///studies/s.db", "sqlite:///studies/s.db"),
        ("postgresql://u@db/s", "postgresql://u@db/s"),
    ],
)
def test_every_url_shown_hides_its_secret(url: str, shown: str) -> None:
    assert shown_url(url) == shown


# Any trace text: a Trace, or a TraceError naming the source (and a line where it has one).

CELLS = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["", " ", '"', "2024-05-10 00:00:00", "1e300", "-0", "null", "[1,2]"]),
    st.text(max_size=6),
)
CSV_LINES = st.lists(CELLS, min_size=1, max_size=4).map(",".join)
JSON_LINES = st.dictionaries(
    st.sampled_from(["timestamp", "input_length", "output_length", "hash_ids", "chat_id", "x"]),
    st.one_of(
        st.integers(min_value=-(2**64), max_value=2**64),
        st.floats(allow_nan=False),
        st.text(max_size=4),
        st.lists(st.integers(min_value=-5, max_value=2**40), max_size=4),
        st.none(),
    ),
).map(json.dumps)
HEADERS = st.sampled_from(
    ["timestamp,input_tokens,output_tokens", "TIMESTAMP,ContextTokens,GeneratedTokens", "a,b"]
)


@st.composite
def trace_texts(draw: st.DrawFn) -> str:
    """A CSV under a known or unknown header, or JSON lines of trace-like keys, or junk."""
    kind = draw(st.sampled_from(["csv", "jsonl", "any"]))
    if kind == "csv":
        return "\n".join([draw(HEADERS), *draw(st.lists(CSV_LINES, max_size=6))])
    if kind == "jsonl":
        return "\n".join(draw(st.lists(JSON_LINES, min_size=1, max_size=6)))
    return draw(st.text(max_size=200))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace_texts())
def test_any_trace_text_reads_or_names_its_line(text: str) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder, "t.csv")
        path.write_text(text, errors="surrogateescape")
        try:
            trace = load_trace(path)
        except InputError as exc:
            assert str(exc).startswith(str(path)) and "\n" not in str(exc), str(exc)
            return
    assert len(trace) >= 1 and trace.span_s <= MAX_SPAN_S
