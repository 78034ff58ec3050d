"""``tuner trace inspect``: the figures, the in-flight estimate, the plot, the exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import run_tuner

from tuner.cli.main import main
from tuner.traces.concurrency import from_samples
from tuner.traces.model import from_columns
from tuner.traces.profile import (
    ServiceModel,
    in_flight,
    profile_concurrency,
    profile_trace,
    time_weighted,
)

AZURE_CODE = Path("/work/shared/traces/AzureLLMInferenceTrace_code.csv")


def test_in_flight_is_exact_on_a_small_case():
    # [0, 2), [1, 3), [3, 4): two overlap during [1, 2); the third starts as the second ends.
    times_s, counts = in_flight(np.array([0.0, 1.0, 3.0]), np.array([2.0, 3.0, 4.0]))
    assert counts.max() == 2
    stats = time_weighted(times_s, counts, 4.0)
    assert stats["mean"] == pytest.approx((1 + 2 + 1 + 1) / 4)  # per second of [0, 4)
    assert stats["idle_share"] == 0.0
    assert stats["max"] == 2


def test_profile_of_a_known_trace():
    # 10 requests one second apart, each in flight 2.5 s: 2 or 3 at a time once started.
    trace = from_columns(np.arange(10.0), [1000] * 10, [50] * 10, source="k")
    profile = profile_trace(trace, window_s=4, service=ServiceModel(1000.0, 0.03))
    assert profile["requests"] == 10 and profile["span_s"] == 9
    assert profile["mean_rate_per_s"] == pytest.approx(10 / 9)
    assert profile["peak_rate_1s_per_s"] == 1
    assert profile["arrivals"]["interarrival_cv"] == pytest.approx(0.0)
    assert profile["arrivals"]["burstiness"] == pytest.approx(-1.0)
    assert profile["in_flight"]["max"] == 3 and profile["in_flight"]["p50"] in (2, 3)
    assert profile["input_tokens"]["p99"] == 1000
    assert profile["busiest_window"]["requests"] == 4
    json.dumps(profile)  # plain numbers only


def test_profile_of_a_concurrency_trace():
    profile = profile_concurrency(from_samples([0, 10, 20], [4, 0, 2]))
    flight = profile["in_flight"]
    assert flight["estimated"] is False
    assert flight["mean"] == pytest.approx(2.0) and flight["idle_share"] == pytest.approx(1 / 3)
    assert flight["max"] == 4


def test_inspect_real_bursty_trace_json_and_png(tmp_path, capsys):
    png = tmp_path / "code.png"
    assert main(["trace", "inspect", str(AZURE_CODE), "--json", "--png", str(png)]) == 0
    profile = json.loads(capsys.readouterr().out)
    # The trace: 8,819 requests over 57 min, very bursty, silences up to 217 s, nothing in
    # flight most of the time.
    assert profile["requests"] == 8819
    assert profile["arrivals"]["longest_gap_s"] == pytest.approx(217, abs=1)
    assert profile["arrivals"]["interarrival_cv"] > 5
    assert profile["in_flight"]["idle_share"] > 0.5
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000


def test_inspect_text_for_people(tmp_path, write_trace):
    path = write_trace("timestamp,concurrency\n0,3\n5,1\n")
    done = run_tuner("trace", "inspect", path, "--no-png", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "concurrency" in done.stdout and "idle 0% of the time" in done.stdout
    assert not list(tmp_path.glob("*.png"))


def test_inspect_with_a_column_mapping(write_trace, capsys):
    path = write_trace("id,when_ms,prompt,completion\n1,0,10,2\n2,500,20,4\n3,2000,30,6\n")
    mapping = "timestamp=when_ms,input_tokens=prompt,output_tokens=completion"
    argv = ["trace", "inspect", str(path), "--columns", mapping, "--time-unit", "ms"]
    assert main([*argv, "--json", "--no-png"]) == 0
    profile = json.loads(capsys.readouterr().out)
    assert profile["requests"] == 3 and profile["span_s"] == 2
    assert profile["input_tokens"]["p50"] == 20
    # A mapping with another format named is a contradiction, refused before reading.
    assert main([*argv, "--format", "azure", "--no-png"]) == 2
    assert "a column mapping is for the columns format, not azure" in capsys.readouterr().err


@pytest.mark.parametrize(
    "text",
    ["", "timestamp,input_tokens,output_tokens\n0,1,0\n", "\x00\x01junk", "a,b\n1,2\n"],
)
def test_bad_input_exits_2_and_writes_nothing(tmp_path, text):
    path = tmp_path / "bad.csv"
    path.write_text(text)
    done = run_tuner("trace", "inspect", path, cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.startswith(f"tuner: {path}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.csv"]
