"""Trace loading, the busiest window, clipping to the context and time scaling."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

import numpy as np
import pytest
from conftest import SHIPPED_TRACE
from hypothesis import given
from hypothesis import strategies as st

from tuner.errors import TraceError
from tuner.traces.formats import load_trace
from tuner.traces.model import busiest_window, busiest_window_start, clip_to_context, from_columns


def stamp(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


# Loading


def test_canonical_seconds_are_sorted_and_rebased(write_trace, caplog):
    path = write_trace("timestamp,input_tokens,output_tokens\n10.5,100,20\n10.0,50,5\n12,7,3\n")
    with caplog.at_level(logging.WARNING):
        trace = load_trace(path)
    assert trace.arrival_s.tolist() == [0.0, 0.5, 2.0]
    assert trace.input_tokens.tolist() == [50, 100, 7]
    assert trace.output_tokens.tolist() == [5, 20, 3]
    assert trace.source == str(path)
    assert "1 timestamps go backwards" in caplog.text


def test_canonical_datetimes_and_extra_columns(write_trace):
    path = write_trace(
        "request_id,timestamp,input_tokens,output_tokens\n"
        "a,2024-01-01T00:00:00Z,10,1\n"
        "b,2024-01-01T00:00:01.250000+00:00,20,2\n"
        "c,2024-01-01T01:00:00+01:00,30,3\n"  # the same instant as the first, in another zone
    )
    trace = load_trace(path)
    assert trace.arrival_s.tolist() == [0.0, 0.0, 1.25]
    assert trace.input_tokens.tolist() == [10, 30, 20]


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ("2023-11-16 18:17:03.9799600", "2023-11-16 18:17:05.4799600"),  # 2023: 7 digits
        ("2024-05-10 00:00:00.009930+00:00", "2024-05-10 00:00:01.509930+00:00"),  # 2024
        ("2024-10-15T12:00:00.269Z", "2024-10-15T12:00:01.769Z"),  # 2025 releases
    ],
)
def test_azure_timestamp_styles(write_trace, first, second):
    path = write_trace(
        f"TIMESTAMP,ContextTokens,GeneratedTokens\n{first},374,44\n{second},396,109\n"
    )
    trace = load_trace(path)
    assert trace.arrival_s.tolist() == pytest.approx([0.0, 1.5], abs=1e-6)
    assert trace.input_tokens.tolist() == [374, 396]
    assert trace.output_tokens.tolist() == [44, 109]


def test_azure_naive_timestamps_are_utc(write_trace):
    # Arrivals are rebased, so check the parser through a two-row gap across midnight.
    path = write_trace(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 23:59:59.5000000,1,1\n"
        "2023-11-17 00:00:00.2500000,1,1\n"
    )
    expected = stamp("2023-11-17 00:00:00.250000") - stamp("2023-11-16 23:59:59.500000")
    assert load_trace(path).arrival_s[1] == pytest.approx(expected)


@pytest.mark.parametrize("newline", ["\n", "\r\n"])
@pytest.mark.parametrize("final_newline", [True, False])
def test_line_endings(write_trace, newline, final_newline):
    rows = ["timestamp,input_tokens,output_tokens", "0,5,6", "1.5,7,8"]
    text = newline.join(rows) + (newline if final_newline else "")
    trace = load_trace(write_trace(text))
    assert trace.arrival_s.tolist() == [0.0, 1.5]
    assert trace.input_tokens.tolist() == [5, 7]
    assert trace.output_tokens.tolist() == [6, 8]


def test_shipped_trace_loads():
    trace = load_trace(SHIPPED_TRACE)
    assert len(trace) == 4529
    assert trace.arrival_s[0] == 0.0
    assert np.all(np.diff(trace.arrival_s) >= 0)
    assert trace.input_tokens.min() >= 1 and trace.output_tokens.min() >= 1


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        ("timestamp,input_tokens,output_tokens\n0,1,1\n1,abc,1\n", 3, "input_tokens"),
        ("timestamp,input_tokens,output_tokens\n0,1,1\n1,1,0\n", 3, "positive"),
        ("timestamp,input_tokens,output_tokens\n0,1,1.5\n", 2, "whole"),
        ("timestamp,input_tokens,output_tokens\n0,1,1\nyesterday,1,1\n", 3, "timestamp"),
        ("timestamp,input_tokens,output_tokens\n0,1,1\n\n2,1\n", 4, "fields"),
        ("timestamp,input_tokens,output_tokens\r\n0,1,1\r\nnan,1,1\r\n", 3, "finite"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03,x,1\n", 2, "Context"),
        ("timestamp,input_tokens\n0,1\n", 1, "unknown trace format"),
    ],
)
def test_malformed_trace_names_file_and_line(write_trace, text, line, words):
    path = write_trace(text)
    with pytest.raises(TraceError) as caught:
        load_trace(path)
    assert caught.value.line == line
    assert str(caught.value).startswith(f"{path}:{line}: ")
    assert words in str(caught.value)


@pytest.mark.parametrize(
    ("text", "words"),
    [("", "empty"), ("timestamp,input_tokens,output_tokens\n", "no requests")],
)
def test_empty_trace_names_file(write_trace, text, words):
    path = write_trace(text)
    with pytest.raises(TraceError, match=words) as caught:
        load_trace(path)
    assert str(caught.value).startswith(str(path))


def test_missing_file(tmp_path):
    with pytest.raises(TraceError, match="cannot read"):
        load_trace(tmp_path / "absent.csv")


# Windowing

ARRIVALS = [0.0, 1.0, 1.5, 2.0, 10.0, 10.1, 10.2, 10.3, 11.0]


def test_busiest_window_by_hand():
    trace = from_columns(ARRIVALS, range(1, 10), range(1, 10))
    start_s, window = busiest_window(trace, 1.0)
    # [10, 11) holds 10.0 .. 10.3; 11.0 is on the open end and stays out.
    assert start_s == 10.0
    assert window.arrival_s.tolist() == pytest.approx([0.0, 0.1, 0.2, 0.3])
    assert window.input_tokens.tolist() == [5, 6, 7, 8]


def test_busiest_window_ties_go_to_the_earliest():
    trace = from_columns([0.0, 0.5, 5.0, 5.5], [1] * 4, [1] * 4)
    assert busiest_window_start(trace, 1.0) == 0.0


def test_window_as_long_as_the_trace_is_the_trace():
    trace = from_columns(ARRIVALS, range(1, 10), range(1, 10))
    start_s, window = busiest_window(trace, 100.0)
    assert start_s == 0.0
    assert window is trace


def test_window_keeps_the_gap_before_its_first_request():
    trace = from_columns([0.0, 3.0, 4.5], [1, 2, 3], [1, 2, 3])
    window = trace.window(2.0, 3.0)
    assert window.arrival_s.tolist() == [1.0, 2.5]
    assert window.input_tokens.tolist() == [2, 3]


def test_window_carries_hash_ids():
    trace = from_columns([2.0, 0.0, 1.0], [1, 2, 3], [1, 1, 1], hash_ids=((2,), (0,), (1,)))
    assert trace.hash_ids == ((0,), (1,), (2,))
    assert trace.window(1.0, 5.0).hash_ids == ((1,), (2,))


@given(
    arrivals=st.lists(
        st.floats(0, 100, allow_nan=False).map(lambda x: round(x, 3)), min_size=1, max_size=60
    ),
    window_s=st.floats(0.01, 30),
    probe_s=st.floats(-10, 100),
)
def test_no_window_holds_more_than_the_busiest(arrivals, window_s, probe_s):
    trace = from_columns(arrivals, [1] * len(arrivals), [1] * len(arrivals))
    start_s = busiest_window_start(trace, window_s)
    best = len(trace.window(start_s, window_s))
    assert best >= len(trace.window(probe_s, window_s))
    assert best >= 1


# Clipping


def test_clip_to_context_by_hand():
    trace = from_columns([0, 1, 2, 3], [8, 3, 2, 9], [5, 20, 2, 1])
    clipped, clipping = clip_to_context(trace, 10)
    # The output is kept where it fits; the prompt gives way first, down to one token.
    assert clipped.output_tokens.tolist() == [5, 9, 2, 1]
    assert clipped.input_tokens.tolist() == [5, 1, 2, 9]
    assert (clipping.inputs_clipped, clipping.outputs_clipped) == (2, 1)
    assert np.all(clipped.input_tokens + clipped.output_tokens <= 10)
    assert clipped.arrival_s is trace.arrival_s


def test_clip_needs_room_for_two_tokens():
    with pytest.raises(ValueError):
        clip_to_context(from_columns([0], [1], [1]), 1)


# Time scaling


def test_time_scale_multiplies_arrivals():
    trace = from_columns([0.0, 1.0, 3.0], [1, 2, 3], [4, 5, 6])
    assert trace.scaled(0.5).arrival_s.tolist() == [0.0, 0.5, 1.5]
    assert trace.scaled(4).arrival_s.tolist() == [0.0, 4.0, 12.0]
    assert trace.scaled(4).input_tokens.tolist() == [1, 2, 3]
    assert trace.scaled(4).span_s == 12.0


@pytest.mark.parametrize("scale", [0, -1])
def test_time_scale_must_be_positive(scale):
    with pytest.raises(ValueError):
        from_columns([0.0], [1], [1]).scaled(scale)


def test_requests_carry_lengths_and_arrivals():
    requests = from_columns([1.0, 0.0], [3, 4], [5, 6]).requests()
    assert [(r.arrival_s, r.input_tokens, r.output_tokens) for r in requests] == [
        (0.0, 4, 6),
        (1.0, 3, 5),
    ]
    assert all(type(r.input_tokens) is int for r in requests)
