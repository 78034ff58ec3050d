"""Every trace format, its detection, bad input with file and line, and fuzzed loaders."""

from __future__ import annotations

import json
import logging
import string
from pathlib import Path

import numpy as np
import pytest
from conftest import cpu_spec, run_tuner, write_spec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tuner.errors import TraceError
from tuner.load.prompts import prompt_token_ids
from tuner.traces.concurrency import load_concurrency
from tuner.traces.formats import (
    PARSERS,
    SIGNATURES,
    decide_format,
    detect_format,
    load_trace,
    parse_column_mapping,
)
from tuner.traces.model import HashIds

AZURE = Path("/work/shared/traces/AzureLLMInferenceTrace_code.csv")


def jsonl(*records: dict) -> str:
    return "".join(json.dumps(r) + "\n" for r in records)


MOONCAKE = jsonl(
    {"timestamp": 0, "input_length": 1100, "output_length": 5, "hash_ids": [0, 1, 2]},
    {"timestamp": 1500, "input_length": 600, "output_length": 7, "hash_ids": [0, 1]},
    {"timestamp": 700, "input_length": 900, "output_length": 3, "hash_ids": [5, 6]},
)
BAILIAN = jsonl(
    {"chat_id": 10, "parent_chat_id": -1, "timestamp": 2.0, "input_length": 40,
     "output_length": 8, "type": "text", "turn": 1, "hash_ids": [1, 2, 3]},
    {"chat_id": 11, "parent_chat_id": 10, "timestamp": 9.5, "input_length": 70,
     "output_length": 9, "type": "text", "turn": 2, "hash_ids": [1, 2, 3, 4, 5]},
    {"chat_id": 12, "parent_chat_id": -1, "timestamp": 4.0, "input_length": 20,
     "output_length": 2, "type": "text", "turn": 1, "hash_ids": [9, 10]},
)  # fmt: skip
BURSTGPT = (
    "Timestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
    "5,a,0,ChatGPT,100,20,120,Conversation log\n"
    "7,b,0,GPT-4,300,0,300,Conversation log\n"
    "9,c,0,ChatGPT,50,0,50,API log\n"
    "12,d,0,GPT-4,80,30,110,API log\n"
    "14,e,0,ChatGPT,60,10,70,API log\n"
)


@pytest.mark.parametrize(
    ("name", "text", "fmt"),
    [
        ("a.csv", "timestamp,input_tokens,output_tokens\n0,1,1\n", "canonical"),
        ("a.jsonl", jsonl({"timestamp": 0, "input_tokens": 1, "output_tokens": 1}), "canonical"),
        ("a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2024-01-01,1,1\n", "azure"),
        ("a.jsonl", MOONCAKE, "mooncake"),
        ("a.jsonl", BAILIAN, "bailian"),
        ("a.csv", BURSTGPT, "burstgpt"),
        ("a.csv", "timestamp,concurrency\n0,3\n", "concurrency"),
        ("a.csv", "# rebuilt\n\ntimestamp,input_tokens,output_tokens\n0,1,1\n", "canonical"),
    ],
)
def test_detects_format(write_trace, name, text, fmt):
    assert detect_format(write_trace(text, name)) == fmt


def test_azure_timestamp_styles_agree(write_trace):
    traces = [
        load_trace(write_trace(f"TIMESTAMP,ContextTokens,GeneratedTokens\r\n{a}\r\n{b}", "a.csv"))
        for a, b in [
            ("2023-11-16 18:17:03.9799600,5,6", "2023-11-16 18:17:05.4799600,7,8"),
            ("2023-11-16 18:17:03.979960+00:00,5,6", "2023-11-16 18:17:05.47996+00:00,7,8"),
            ("2023-11-16T18:17:03.97996Z,5,6", "2023-11-16T18:17:05.47996Z,7,8"),
        ]
    ]
    for trace in traces:
        assert trace.arrival_s.tolist() == pytest.approx([0.0, 1.5])
        assert trace.input_tokens.tolist() == [5, 7]


def test_real_azure_trace_matches_its_readme():
    trace = load_trace(AZURE)
    assert len(trace) == 8819
    assert np.percentile(trace.input_tokens, 50) == pytest.approx(1469, abs=1)
    assert np.percentile(trace.output_tokens, 50) == pytest.approx(13, abs=1)


def test_mooncake_milliseconds_and_shared_prefix_blocks(write_trace):
    trace = load_trace(write_trace(MOONCAKE, "m.jsonl"))
    assert trace.arrival_s.tolist() == [0.0, 0.7, 1.5]
    assert trace.block_tokens == 512
    first, _, second = trace.requests()
    one = prompt_token_ids(0, first, 8192, trace.block_tokens)
    two = prompt_token_ids(2, second, 8192, trace.block_tokens)
    assert len(one) == 1100 and len(two) == 600
    assert one[:512] == two[:512]  # hash id 0 is one shared block
    assert one[512:600] == two[512:600]  # hash id 1 shared up to the shorter prompt
    other = prompt_token_ids(1, trace.requests()[1], 8192, trace.block_tokens)
    assert other[:512] != one[:512]  # hash ids 5, 6 share nothing with 0, 1


def test_hash_ids_follow_sorting_and_windows_like_tuples(write_trace):
    rows = [(t, [t % 3, t]) for t in (5000, 1000, 3000, 2000, 4000)]
    text = jsonl(*({"timestamp": t, "input_length": 600, "output_length": 1, "hash_ids": ids}
                   for t, ids in rows))  # fmt: skip
    trace = load_trace(write_trace(text, "m.jsonl"))
    expected = tuple(tuple(ids) for _, ids in sorted(rows))
    assert isinstance(trace.hash_ids, HashIds) and trace.hash_ids == expected
    assert trace.window(1.0, 2.0).hash_ids == expected[1:3]
    assert [r.hash_ids for r in trace.take(3, 5).requests()] == list(expected[3:5])
    assert trace.hash_ids[::-2] == expected[::-2] and trace.hash_ids[-1] == expected[-1]
    assert trace.hash_ids != (*expected[:-1], (9,))
    huge = HashIds.from_lists([(2**70, 1), ()])  # beyond int64: kept exact
    assert list(huge.take(np.array([1, 0]))) == [(), (2**70, 1)]


def test_line_numbers_past_blank_lines_from_the_fast_path(write_trace):
    bad = MOONCAKE.replace('"input_length": 900', '"input_length": 0')
    path = write_trace("\n" + MOONCAKE + "\n\n" + bad, "m.jsonl")
    with pytest.raises(TraceError) as caught:
        load_trace(path)
    assert caught.value.line == 9 and "positive" in str(caught.value)


def test_traces_without_hash_ids_share_nothing(write_trace):
    trace = load_trace(write_trace("timestamp,input_tokens,output_tokens\n0,600,1\n1,600,1\n"))
    a, b = trace.requests()
    assert trace.hash_ids is None
    one, two = prompt_token_ids(0, a, 8192), prompt_token_ids(1, b, 8192)
    assert one[:16] != two[:16]


def test_bailian_seconds_blocks_and_conversations(write_trace):
    trace = load_trace(write_trace(BAILIAN, "b.jsonl"))
    assert trace.arrival_s.tolist() == [0.0, 2.0, 7.5]
    assert trace.block_tokens == 16
    assert trace.session_id is not None
    assert trace.session_id.tolist() == ["10", "12", "10"]
    first, _, follow_up = trace.requests()
    one = prompt_token_ids(0, first, 8192, 16)
    two = prompt_token_ids(2, follow_up, 8192, 16)
    assert one[:40] == two[:40]


def test_burstgpt_by_name_model_filter_and_failures(write_trace, caplog):
    path = write_trace(BURSTGPT)
    with caplog.at_level(logging.WARNING):
        trace = load_trace(path)
    assert len(trace) == 3
    assert "dropped 2 failed requests" in caplog.text
    chatgpt = load_trace(path, model="ChatGPT")
    assert chatgpt.input_tokens.tolist() == [100, 60]
    assert chatgpt.arrival_s.tolist() == [0.0, 9.0]
    with pytest.raises(TraceError, match="no rows of model 'Claude'; found ChatGPT, GPT-4"):
        load_trace(path, model="Claude")


def test_column_mapping_with_time_unit(write_trace):
    text = "id,when_ms,prompt,completion\n1,1000,10,2\n2,3500,20,4\n"
    path = write_trace(text)
    mapping = parse_column_mapping("timestamp=when_ms,input_tokens=prompt,output_tokens=completion")
    trace = load_trace(path, columns=mapping, time_unit="ms")
    assert trace.arrival_s.tolist() == [0.0, 2.5]
    assert trace.output_tokens.tolist() == [2, 4]
    jpath = write_trace(
        jsonl({"t": 5, "i": 3, "o": 4, "h": [1]}, {"t": 6, "i": 3, "o": 4, "h": [1]}), "c.jsonl"
    )
    mapped = load_trace(
        jpath, "columns", columns={"timestamp": "t", "input_tokens": "i", "output_tokens": "o",
        "hash_ids": "h"}, block_tokens=2,
    )  # fmt: skip
    assert mapped.hash_ids == ((1,), (1,)) and mapped.block_tokens == 2
    with pytest.raises(ValueError, match="lacks output_tokens"):
        parse_column_mapping("timestamp=a,input_tokens=b")


def test_canonical_session_id_and_sorting(write_trace, caplog):
    path = write_trace(
        "timestamp,input_tokens,output_tokens,session_id\n3,1,1,b\n1,2,2,a\n1,3,3,a\n"
    )
    with caplog.at_level(logging.WARNING):
        trace = load_trace(path)
    assert "1 timestamps go backwards" in caplog.text
    assert trace.arrival_s.tolist() == [0.0, 0.0, 2.0]  # equal timestamps are kept
    assert trace.session_id is not None and trace.session_id.tolist() == ["a", "a", "b"]


def test_quoted_csv_takes_the_row_path(write_trace):
    trace = load_trace(write_trace('timestamp,input_tokens,output_tokens\n"0","5",6\n1,"7",8\n'))
    assert trace.input_tokens.tolist() == [5, 7]


@pytest.mark.parametrize(
    ("name", "text", "line", "words"),
    [
        ("a.csv", "timestamp,input_tokens,output_tokens\n0,1,1\n1,-4,1\n", 3, "positive"),
        ("a.csv", "timestamp,input_tokens,output_tokens\n0,1,1\n1,1,NaN\n", 3, "whole"),
        ("a.csv", "timestamp,input_tokens,output_tokens\n0,1,1\n1,1,1e12\n", 3, "implausibly"),
        ("a.csv", "timestamp,input_tokens,output_tokens\n0,1,1\n1,1,1\n2,1", 4, "fields"),
        ("a.csv", "timestamp,input_tokens,output_tokens\n0,1,1\n1,1,1,1\n", 3, "fields"),
        ("a.csv", "timestamp,input_tokens,output_tokens\n0,1,1\n1,1,\"2\n", 3, "unreadable CSV"),
        ("a.csv", "timestamp,input_tokens,output_tokens\n0,1,1\n1,\xe9,1\n", 3, "number"),
        ("a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03,1,1\nx,1,1\n", 3,
         "timestamp"),
        ("a.csv", "Timestamp,Model,Request tokens,Response tokens\n1,A,0,5\n", 2, "positive"),
        ("a.csv", "timestamp,tokens\n1,2\n", 1, "unknown trace format"),
        ("m.jsonl", MOONCAKE + '{"timestamp": 1, "input_length": 5}\n', 4, "output_length"),
        ("m.jsonl", MOONCAKE + '{"timestamp": 1, "input_le', 4, "not JSON"),
        ("m.jsonl", MOONCAKE + "[1, 2]\n", 4, "JSON object"),
        ("m.jsonl", MOONCAKE.replace("[0, 1]", '"x"'), 2, "hash_ids"),
        ("m.jsonl", MOONCAKE.replace("[0, 1]", "[0, -1]"), 2, "non-negative"),
        ("m.jsonl", MOONCAKE.replace("600", "true"), 2, "input_length"),
        ("m.jsonl", MOONCAKE.replace("1500", "NaN"), 2, "finite"),
    ],
)  # fmt: skip
def test_bad_rows_name_file_and_line(write_trace, name, text, line, words):
    path = write_trace(text, name)
    with pytest.raises(TraceError) as caught:
        load_trace(path)
    assert caught.value.line == line, str(caught.value)
    assert str(caught.value).startswith(f"{path}:{line}: ")
    assert words in str(caught.value)


CSV_HEADER = "timestamp,input_tokens,output_tokens\n"
BURST_HEADER = "Timestamp,Model,Request tokens,Response tokens\n"


@pytest.mark.parametrize(
    ("name", "text", "columns", "line", "words"),
    [
        ("a.csv", CSV_HEADER + "0,1,1\n-2,1,1\n", None, 3, "timestamp is negative (-2)"),
        ("a.csv", CSV_HEADER + '0,1,1\n"-2",1,1\n', None, 3, "timestamp is negative (-2)"),
        ("a.csv", CSV_HEADER + "0,1,1\ninf,1,1\n", None, 3, "timestamp is not a finite number"),
        ("a.csv", CSV_HEADER + "0,1,1\n-inf,1,1\n", None, 3, "timestamp is not a finite number"),
        ("a.csv", CSV_HEADER + '0,1,1\n"nan",1,1\n', None, 3, "timestamp is not a finite number"),
        ("a.csv", CSV_HEADER + "0,1,1\n1e400,1,1\n", None, 3, "timestamp is not a finite number"),
        ("a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n1970-01-01 00:00:01,1,1\n"
         "1969-12-31 23:59:59,1,1\n", None, 3, "TIMESTAMP is negative (-1)"),
        ("a.csv", BURST_HEADER + "1,A,1,5\n-0.5,A,1,5\n", None, 3, "Timestamp is negative (-0.5)"),
        ("a.csv", BURST_HEADER + "1,A,1,5\nnan,A,1,5\n", None, 3, "Timestamp is not a finite"),
        ("a.csv", "ts,a,b\n5,1,1\n-5,1,1\n", "timestamp=ts,input_tokens=a,output_tokens=b", 3,
         "ts is negative (-5)"),
        ("a.csv", "ts,a,b\n5,1,1\ninf,1,1\n", "timestamp=ts,input_tokens=a,output_tokens=b", 3,
         "ts is not a finite number"),
        ("m.jsonl", MOONCAKE.replace('"timestamp": 700', '"timestamp": -700'), None, 3,
         "timestamp is negative (-700)"),
        ("m.jsonl", MOONCAKE.replace('"timestamp": 700', '"timestamp": Infinity'), None, 3,
         "timestamp is not a finite number"),
        ("b.jsonl", BAILIAN.replace('"timestamp": 4.0', '"timestamp": -4.0'), None, 3,
         "timestamp is negative (-4)"),
        ("c.jsonl", jsonl({"timestamp": 1, "input_tokens": 2, "output_tokens": 3},
                          {"timestamp": -1, "input_tokens": 2, "output_tokens": 3}), None, 2,
         "timestamp is negative (-1)"),
    ],
)  # fmt: skip
def test_negative_or_non_finite_timestamps_name_file_and_line(
    write_trace, name, text, columns, line, words
):
    path = write_trace(text, name)
    with pytest.raises(TraceError) as caught:
        load_trace(path, columns=parse_column_mapping(columns) if columns else None)
    assert str(caught.value).startswith(f"{path}:{line}: {words}"), str(caught.value)


@pytest.mark.parametrize(
    ("rows", "words"),
    [("0,1\n-1,2\n", "timestamp is negative (-1)"), ("0,1\nnan,2\n", "not a finite")],
)
def test_concurrency_timestamps_are_checked_alike(write_trace, rows, words):
    path = write_trace("timestamp,concurrency\n" + rows)
    with pytest.raises(TraceError, match=rf"^{path}:3: timestamp is (negative|not a finite)"):
        load_concurrency(path)
    done = run_tuner("trace", "inspect", path, "--no-png", cwd=path.parent)
    assert done.returncode == 2 and done.stderr.startswith(f"tuner: {path}:3: ")
    assert words in done.stderr and len(done.stderr.splitlines()) == 1


def test_binary_junk_and_bad_utf8(tmp_path):
    junk = tmp_path / "junk.csv"
    junk.write_bytes(b"timestamp,input_tokens,output_tokens\n0,1,1\n\x00\x01\x02\xff")
    with pytest.raises(TraceError, match=r"junk.csv:3: binary data"):
        load_trace(junk, "canonical")
    latin = tmp_path / "latin.csv"
    latin.write_bytes(b"timestamp,input_tokens,output_tokens\n0,1,1\n1,1,1\xe9\n")
    with pytest.raises(TraceError, match=r"latin.csv:3: not UTF-8"):
        load_trace(latin)


def test_empty_and_comment_only_files(write_trace):
    for text in ("", "\n\n", "# nothing\n"):
        with pytest.raises(TraceError, match="empty"):
            load_trace(write_trace(text))
    with pytest.raises(TraceError, match="no requests after the header"):
        load_trace(write_trace("timestamp,input_tokens,output_tokens\n\n"))


def test_one_gigabyte_file_is_refused_before_reading(tmp_path):
    big = tmp_path / "big.csv"
    with big.open("wb") as handle:  # sparse: instant, and takes no disk
        handle.write(b"timestamp,input_tokens,output_tokens\n")
        handle.truncate(1 << 30)
    with pytest.raises(TraceError, match="1024 MiB is over the 512 MiB limit"):
        load_trace(big)


MAPPED = "id,when_ms,prompt,completion\n" + "".join(
    f"{i},{i * 250},{10 + i},{2 + i % 3}\n" for i in range(20)
)
MAPPING = "timestamp=when_ms,input_tokens=prompt,output_tokens=completion"


def test_one_function_decides_the_format(write_trace):
    mapped = write_trace(MAPPED, "mapped.csv")
    columns = parse_column_mapping(MAPPING)
    assert decide_format(mapped, None, columns) == "columns"
    assert decide_format(mapped, "columns", columns) == "columns"
    concurrency = write_trace("timestamp,concurrency\n0,3\n", "c.csv")
    assert decide_format(concurrency, None, None) == "concurrency"
    assert decide_format(concurrency, "concurrency", None) == "concurrency"
    with pytest.raises(TraceError, match="unknown trace format"):
        decide_format(mapped, None, None)
    with pytest.raises(TraceError, match="a column mapping is for the columns format, not azure"):
        decide_format(mapped, "azure", columns)
    with pytest.raises(TraceError, match="unknown format 'parquet'"):
        decide_format(mapped, "parquet", None)


def test_tuner_run_with_columns_needs_no_format(tmp_path, write_trace, cpu_model):
    path = write_trace(MAPPED, "mapped.csv")
    spec = write_spec(tmp_path / "spec.yaml", cpu_spec(cpu_model))
    done = run_tuner(
        "run", "--trace", path, "--columns", MAPPING, "--time-unit", "ms", "--spec", spec,
        "--n-trials", "0", "--storage", f"sqlite:///{tmp_path / 's.db'}", cwd=tmp_path,
    )  # fmt: skip
    assert f"trace {path}: 20 requests over 5 s" in done.stdout, done.stderr
    # No trial ran, so none served the window: exit 1, nothing written.
    assert done.returncode == 1, done.stderr
    assert "no trial served the window" in done.stderr


def test_concurrency_trace_is_not_a_request_trace(write_trace):
    with pytest.raises(TraceError, match="concurrency trace"):
        load_trace(write_trace("timestamp,concurrency\n0,3\n1,4\n"))


def test_unknown_format_name(write_trace):
    with pytest.raises(TraceError, match="unknown format 'parquet'"):
        load_trace(write_trace("timestamp,input_tokens,output_tokens\n0,1,1\n"), "parquet")


# --- fuzzing ------------------------------------------------------------------------------

CELLS = st.one_of(
    st.integers(-3, 10**13).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["", " ", "nan", "1e400", "2024-05-10 00:00:00.009930+00:00", '"', "#", "x"]),
    st.text(string.printable, max_size=6),
)
HEADERS = [
    "timestamp,input_tokens,output_tokens",
    "TIMESTAMP,ContextTokens,GeneratedTokens",
    "Timestamp,Model,Request tokens,Response tokens",
    "timestamp,concurrency",
]
FUZZ = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@FUZZ
@given(
    header=st.sampled_from(HEADERS),
    rows=st.lists(st.lists(CELLS, min_size=1, max_size=5), max_size=6),
    fmt=st.sampled_from([None, *PARSERS]),
    newline=st.sampled_from(["\n", "\r\n"]),
)
def test_fuzzed_csv_raises_only_trace_errors(tmp_path_factory, header, rows, fmt, newline):
    path = tmp_path_factory.mktemp("fuzz") / "t.csv"
    path.write_text(newline.join([header, *(",".join(r) for r in rows)]), newline="")
    _load_or_trace_error(path, fmt)


RECORD_VALUES = st.one_of(
    st.integers(-5, 10**20), st.floats(), st.text(max_size=5), st.none(), st.booleans(),
    st.lists(st.integers(-5, 2**70), max_size=4), st.lists(st.text(max_size=2), max_size=2),
)  # fmt: skip
KEYS = ["timestamp", "input_length", "output_length", "hash_ids", "chat_id", "parent_chat_id",
        "input_tokens", "output_tokens", "turn"]  # fmt: skip


@FUZZ
@given(
    records=st.lists(st.dictionaries(st.sampled_from(KEYS), RECORD_VALUES), max_size=5),
    fmt=st.sampled_from([None, "mooncake", "bailian", "canonical"]),
    tail=st.sampled_from(["", '{"timest', "\n[1]", '\n"s"']),
)
def test_fuzzed_jsonl_raises_only_trace_errors(tmp_path_factory, records, fmt, tail):
    path = tmp_path_factory.mktemp("fuzz") / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + tail)
    _load_or_trace_error(path, fmt)


@FUZZ
@given(data=st.binary(max_size=300), fmt=st.sampled_from([None, *PARSERS]))
def test_fuzzed_bytes_raise_only_trace_errors(tmp_path_factory, data, fmt):
    path = tmp_path_factory.mktemp("fuzz") / "t.csv"
    path.write_bytes(b"timestamp,input_tokens,output_tokens\n" + data)
    _load_or_trace_error(path, fmt)


def _load_or_trace_error(path: Path, fmt: str | None) -> None:
    columns = {"timestamp": "timestamp", "input_tokens": "input_tokens"}
    columns["output_tokens"] = "output_tokens"
    try:
        trace = load_trace(path, fmt, columns=columns if fmt == "columns" else None)
    except TraceError:
        return
    assert len(trace) >= 1
    assert np.all(np.diff(trace.arrival_s) >= 0) and trace.arrival_s[0] == 0
    assert trace.input_tokens.min() >= 1 and trace.output_tokens.min() >= 1


@pytest.mark.parametrize(
    "text",
    [
        "",
        "timestamp,input_tokens,output_tokens\n1,1,1\n0,1,-1\n",
        "timestamp,input_tokens,output_tokens\n1,1,1\n-3,1,1\n",
        "\x00junk",
        "x,y\n1,2\n",
    ],
)
def test_tuner_run_on_bad_trace_exits_2_and_writes_nothing(tmp_path, text):
    path = tmp_path / "bad.csv"
    path.write_text(text)
    done = run_tuner("run", "--trace", path, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(f"tuner: {path}") and len(done.stderr.splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.csv"]


def test_an_unknown_file_is_told_every_format_the_table_recognises(write_trace):
    """The error lists each signature's name and keys, so a format added to the table is named
    there without another edit; each signature's own keys are recognised as its format."""
    unknown = write_trace("when,prompt\n1,2\n", "u.csv")
    with pytest.raises(TraceError) as raised:
        detect_format(unknown)
    for signature in SIGNATURES:
        assert f"{signature.label} ({signature.shown})" in str(raised.value)
    for n, signature in enumerate(SIGNATURES):
        keys = sorted(signature.keys[0])
        if signature.record == "csv":
            text = ",".join(keys) + "\n" + ",".join("1" for _ in keys) + "\n"
        else:
            text = json.dumps(dict.fromkeys(keys, 1)) + "\n"
        assert detect_format(write_trace(text, f"s{n}.{signature.record}")) == signature.fmt
