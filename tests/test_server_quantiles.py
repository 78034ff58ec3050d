"""Server-side quantiles from a real ``/metrics`` of vLLM: a quantile in a histogram's first
bucket is recorded as a bound (``..._at_most_s``), not as a figure interpolated inside it.

BEFORE and AFTER are three of vLLM's histogram families as its ``/metrics`` gave them, line for
line, from the CPU build (2026-11-26, vLLM 0.32.0, tuner c4cbcf1, ``cpu-demo`` dummy model,
max-num-seqs 2): BEFORE after one warm-up request, AFTER once six requests of 16 to 21 prompt
tokens and 48 output tokens, sent at once, had finished: two ran while the others queued.
Between the two, every prefill and half of the queue times fell in the first bucket (0 to
0.3 s).
"""

from __future__ import annotations

import pytest

from tuner.load.metrics import parse_scrape, summarize_server

BEFORE = """\
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="/tmp/asc/cpu-demo"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.005",model_name="/tmp/asc/cpu-demo"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.01",model_name="/tmp/asc/cpu-demo"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.02",model_name="/tmp/asc/cpu-demo"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.04",model_name="/tmp/asc/cpu-demo"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.06",model_name="/tmp/asc/cpu-demo"} 1.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.08",model_name="/tmp/asc/cpu-demo"} 1.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="/tmp/asc/cpu-demo"} 1.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.25",model_name="/tmp/asc/cpu-demo"} 1.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.5",model_name="/tmp/asc/cpu-demo"} 1.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.75",model_name="/tmp/asc/cpu-demo"} 1.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="1.0",model_name="/tmp/asc/cpu-demo"} 1.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="2.5",model_name="/tmp/asc/cpu-demo"} 1.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="5.0",model_name="/tmp/asc/cpu-demo"} 1.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="7.5",model_name="/tmp/asc/cpu-demo"} 1.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="10.0",model_name="/tmp/asc/cpu-demo"} 1.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="20.0",model_name="/tmp/asc/cpu-demo"} 1.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="40.0",model_name="/tmp/asc/cpu-demo"} 1.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="80.0",model_name="/tmp/asc/cpu-demo"} 1.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="160.0",model_name="/tmp/asc/cpu-demo"} 1.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="640.0",model_name="/tmp/asc/cpu-demo"} 1.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="2560.0",model_name="/tmp/asc/cpu-demo"} 1.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="/tmp/asc/cpu-demo"} 1.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="/tmp/asc/cpu-demo"} 1.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="/tmp/asc/cpu-demo"} 0.047156333923339844
# HELP vllm:request_queue_time_seconds Histogram of time spent in WAITING phase for request.
# TYPE vllm:request_queue_time_seconds histogram
vllm:request_queue_time_seconds_bucket{engine="0",le="0.3",model_name="/tmp/asc/cpu-demo"} 1.0
vllm:request_queue_time_seconds_bucket{engine="0",le="0.5",model_name="/tmp/asc/cpu-demo"} 1.0
vllm:request_queue_time_seconds_bucket{engine="0",le="0.8",model_name="/tmp/asc/cpu-demo"} 1.0
vllm:request_queue_time_seconds_bucket{engine="0",le="1.0",model_name="/tmp/asc/cpu-demo"} 1.0
vllm:request_queue_time_seconds_bucket{engine="0",le="1.5",model_name="/tmp/asc/cpu-demo"} 1.0
vllm:request_queue_time_seconds_bucket{engine="0",le="2.0",model_name="/tmp/asc/cpu-demo"} 1.0
vllm:request_queue_time_seconds_bucket{engine="0",le="2.5",model_name="/tmp/asc/cpu-demo"} 1.0
vllm:request_queue_time_seconds_bucket{engine="0",le="5.0",model_name="/tmp/asc/cpu-demo"} 1.0
vllm:request_queue_time_seconds_bucket{engine="0",le="10.0",model_name="/tmp/asc/cpu-demo"} 1.0
vllm:request_queue_time_seconds_bucket{engine="0",le="15.0",model_name="/tmp/asc/cpu-demo"} 1.0
vllm:request_queue_time_seconds_bucket{engine="0",le="20.0",model_name="/tmp/asc/cpu-demo"} 1.0
vllm:request_queue_time_seconds_bucket{engine="0",le="30.0",model_name="/tmp/asc/cpu-demo"} 1.0
vllm:request_queue_time_seconds_bucket{engine="0",le="40.0",model_name="/tmp/asc/cpu-demo"} 1.0
vllm:request_queue_time_seconds_bucket{engine="0",le="50.0",model_name="/tmp/asc/cpu-demo"} 1.0
vllm:request_queue_time_seconds_bucket{engine="0",le="60.0",model_name="/tmp/asc/cpu-demo"} 1.0
vllm:request_queue_time_seconds_bucket{engine="0",le="120.0",model_name="/tmp/asc/cpu-demo"} 1.0
vllm:request_queue_time_seconds_bucket{engine="0",le="240.0",model_name="/tmp/asc/cpu-demo"} 1.0
vllm:request_queue_time_seconds_bucket{engine="0",le="480.0",model_name="/tmp/asc/cpu-demo"} 1.0
vllm:request_queue_time_seconds_bucket{engine="0",le="960.0",model_name="/tmp/asc/cpu-demo"} 1.0
vllm:request_queue_time_seconds_bucket{engine="0",le="1920.0",model_name="/tmp/asc/cpu-demo"} 1.0
vllm:request_queue_time_seconds_bucket{engine="0",le="7680.0",model_name="/tmp/asc/cpu-demo"} 1.0
vllm:request_queue_time_seconds_bucket{engine="0",le="+Inf",model_name="/tmp/asc/cpu-demo"} 1.0
vllm:request_queue_time_seconds_count{engine="0",model_name="/tmp/asc/cpu-demo"} 1.0
vllm:request_queue_time_seconds_sum{engine="0",model_name="/tmp/asc/cpu-demo"} 5.677599983755499e-05
# HELP vllm:request_prefill_time_seconds Histogram of time spent in PREFILL phase for request.
# TYPE vllm:request_prefill_time_seconds histogram
vllm:request_prefill_time_seconds_bucket{engine="0",le="0.3",model_name="/tmp/asc/cpu-demo"} 1.0
vllm:request_prefill_time_seconds_bucket{engine="0",le="0.5",model_name="/tmp/asc/cpu-demo"} 1.0
vllm:request_prefill_time_seconds_bucket{engine="0",le="0.8",model_name="/tmp/asc/cpu-demo"} 1.0
vllm:request_prefill_time_seconds_bucket{engine="0",le="1.0",model_name="/tmp/asc/cpu-demo"} 1.0
vllm:request_prefill_time_seconds_bucket{engine="0",le="1.5",model_name="/tmp/asc/cpu-demo"} 1.0
vllm:request_prefill_time_seconds_bucket{engine="0",le="2.0",model_name="/tmp/asc/cpu-demo"} 1.0
vllm:request_prefill_time_seconds_bucket{engine="0",le="2.5",model_name="/tmp/asc/cpu-demo"} 1.0
vllm:request_prefill_time_seconds_bucket{engine="0",le="5.0",model_name="/tmp/asc/cpu-demo"} 1.0
vllm:request_prefill_time_seconds_bucket{engine="0",le="10.0",model_name="/tmp/asc/cpu-demo"} 1.0
vllm:request_prefill_time_seconds_bucket{engine="0",le="15.0",model_name="/tmp/asc/cpu-demo"} 1.0
vllm:request_prefill_time_seconds_bucket{engine="0",le="20.0",model_name="/tmp/asc/cpu-demo"} 1.0
vllm:request_prefill_time_seconds_bucket{engine="0",le="30.0",model_name="/tmp/asc/cpu-demo"} 1.0
vllm:request_prefill_time_seconds_bucket{engine="0",le="40.0",model_name="/tmp/asc/cpu-demo"} 1.0
vllm:request_prefill_time_seconds_bucket{engine="0",le="50.0",model_name="/tmp/asc/cpu-demo"} 1.0
vllm:request_prefill_time_seconds_bucket{engine="0",le="60.0",model_name="/tmp/asc/cpu-demo"} 1.0
vllm:request_prefill_time_seconds_bucket{engine="0",le="120.0",model_name="/tmp/asc/cpu-demo"} 1.0
vllm:request_prefill_time_seconds_bucket{engine="0",le="240.0",model_name="/tmp/asc/cpu-demo"} 1.0
vllm:request_prefill_time_seconds_bucket{engine="0",le="480.0",model_name="/tmp/asc/cpu-demo"} 1.0
vllm:request_prefill_time_seconds_bucket{engine="0",le="960.0",model_name="/tmp/asc/cpu-demo"} 1.0
vllm:request_prefill_time_seconds_bucket{engine="0",le="1920.0",model_name="/tmp/asc/cpu-demo"} 1.0
vllm:request_prefill_time_seconds_bucket{engine="0",le="7680.0",model_name="/tmp/asc/cpu-demo"} 1.0
vllm:request_prefill_time_seconds_bucket{engine="0",le="+Inf",model_name="/tmp/asc/cpu-demo"} 1.0
vllm:request_prefill_time_seconds_count{engine="0",model_name="/tmp/asc/cpu-demo"} 1.0
vllm:request_prefill_time_seconds_sum{engine="0",model_name="/tmp/asc/cpu-demo"} 0.02512869499878434
"""

AFTER = """\
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="/tmp/asc/cpu-demo"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.005",model_name="/tmp/asc/cpu-demo"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.01",model_name="/tmp/asc/cpu-demo"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.02",model_name="/tmp/asc/cpu-demo"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.04",model_name="/tmp/asc/cpu-demo"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.06",model_name="/tmp/asc/cpu-demo"} 1.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.08",model_name="/tmp/asc/cpu-demo"} 1.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="/tmp/asc/cpu-demo"} 3.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.25",model_name="/tmp/asc/cpu-demo"} 4.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.5",model_name="/tmp/asc/cpu-demo"} 4.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.75",model_name="/tmp/asc/cpu-demo"} 4.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="1.0",model_name="/tmp/asc/cpu-demo"} 4.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="2.5",model_name="/tmp/asc/cpu-demo"} 7.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="5.0",model_name="/tmp/asc/cpu-demo"} 7.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="7.5",model_name="/tmp/asc/cpu-demo"} 7.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="10.0",model_name="/tmp/asc/cpu-demo"} 7.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="20.0",model_name="/tmp/asc/cpu-demo"} 7.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="40.0",model_name="/tmp/asc/cpu-demo"} 7.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="80.0",model_name="/tmp/asc/cpu-demo"} 7.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="160.0",model_name="/tmp/asc/cpu-demo"} 7.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="640.0",model_name="/tmp/asc/cpu-demo"} 7.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="2560.0",model_name="/tmp/asc/cpu-demo"} 7.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="/tmp/asc/cpu-demo"} 7.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="/tmp/asc/cpu-demo"} 7.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="/tmp/asc/cpu-demo"} 5.1147074699401855
# HELP vllm:request_queue_time_seconds Histogram of time spent in WAITING phase for request.
# TYPE vllm:request_queue_time_seconds histogram
vllm:request_queue_time_seconds_bucket{engine="0",le="0.3",model_name="/tmp/asc/cpu-demo"} 4.0
vllm:request_queue_time_seconds_bucket{engine="0",le="0.5",model_name="/tmp/asc/cpu-demo"} 4.0
vllm:request_queue_time_seconds_bucket{engine="0",le="0.8",model_name="/tmp/asc/cpu-demo"} 4.0
vllm:request_queue_time_seconds_bucket{engine="0",le="1.0",model_name="/tmp/asc/cpu-demo"} 4.0
vllm:request_queue_time_seconds_bucket{engine="0",le="1.5",model_name="/tmp/asc/cpu-demo"} 6.0
vllm:request_queue_time_seconds_bucket{engine="0",le="2.0",model_name="/tmp/asc/cpu-demo"} 6.0
vllm:request_queue_time_seconds_bucket{engine="0",le="2.5",model_name="/tmp/asc/cpu-demo"} 7.0
vllm:request_queue_time_seconds_bucket{engine="0",le="5.0",model_name="/tmp/asc/cpu-demo"} 7.0
vllm:request_queue_time_seconds_bucket{engine="0",le="10.0",model_name="/tmp/asc/cpu-demo"} 7.0
vllm:request_queue_time_seconds_bucket{engine="0",le="15.0",model_name="/tmp/asc/cpu-demo"} 7.0
vllm:request_queue_time_seconds_bucket{engine="0",le="20.0",model_name="/tmp/asc/cpu-demo"} 7.0
vllm:request_queue_time_seconds_bucket{engine="0",le="30.0",model_name="/tmp/asc/cpu-demo"} 7.0
vllm:request_queue_time_seconds_bucket{engine="0",le="40.0",model_name="/tmp/asc/cpu-demo"} 7.0
vllm:request_queue_time_seconds_bucket{engine="0",le="50.0",model_name="/tmp/asc/cpu-demo"} 7.0
vllm:request_queue_time_seconds_bucket{engine="0",le="60.0",model_name="/tmp/asc/cpu-demo"} 7.0
vllm:request_queue_time_seconds_bucket{engine="0",le="120.0",model_name="/tmp/asc/cpu-demo"} 7.0
vllm:request_queue_time_seconds_bucket{engine="0",le="240.0",model_name="/tmp/asc/cpu-demo"} 7.0
vllm:request_queue_time_seconds_bucket{engine="0",le="480.0",model_name="/tmp/asc/cpu-demo"} 7.0
vllm:request_queue_time_seconds_bucket{engine="0",le="960.0",model_name="/tmp/asc/cpu-demo"} 7.0
vllm:request_queue_time_seconds_bucket{engine="0",le="1920.0",model_name="/tmp/asc/cpu-demo"} 7.0
vllm:request_queue_time_seconds_bucket{engine="0",le="7680.0",model_name="/tmp/asc/cpu-demo"} 7.0
vllm:request_queue_time_seconds_bucket{engine="0",le="+Inf",model_name="/tmp/asc/cpu-demo"} 7.0
vllm:request_queue_time_seconds_count{engine="0",model_name="/tmp/asc/cpu-demo"} 7.0
vllm:request_queue_time_seconds_sum{engine="0",model_name="/tmp/asc/cpu-demo"} 4.273197924001579
# HELP vllm:request_prefill_time_seconds Histogram of time spent in PREFILL phase for request.
# TYPE vllm:request_prefill_time_seconds histogram
vllm:request_prefill_time_seconds_bucket{engine="0",le="0.3",model_name="/tmp/asc/cpu-demo"} 7.0
vllm:request_prefill_time_seconds_bucket{engine="0",le="0.5",model_name="/tmp/asc/cpu-demo"} 7.0
vllm:request_prefill_time_seconds_bucket{engine="0",le="0.8",model_name="/tmp/asc/cpu-demo"} 7.0
vllm:request_prefill_time_seconds_bucket{engine="0",le="1.0",model_name="/tmp/asc/cpu-demo"} 7.0
vllm:request_prefill_time_seconds_bucket{engine="0",le="1.5",model_name="/tmp/asc/cpu-demo"} 7.0
vllm:request_prefill_time_seconds_bucket{engine="0",le="2.0",model_name="/tmp/asc/cpu-demo"} 7.0
vllm:request_prefill_time_seconds_bucket{engine="0",le="2.5",model_name="/tmp/asc/cpu-demo"} 7.0
vllm:request_prefill_time_seconds_bucket{engine="0",le="5.0",model_name="/tmp/asc/cpu-demo"} 7.0
vllm:request_prefill_time_seconds_bucket{engine="0",le="10.0",model_name="/tmp/asc/cpu-demo"} 7.0
vllm:request_prefill_time_seconds_bucket{engine="0",le="15.0",model_name="/tmp/asc/cpu-demo"} 7.0
vllm:request_prefill_time_seconds_bucket{engine="0",le="20.0",model_name="/tmp/asc/cpu-demo"} 7.0
vllm:request_prefill_time_seconds_bucket{engine="0",le="30.0",model_name="/tmp/asc/cpu-demo"} 7.0
vllm:request_prefill_time_seconds_bucket{engine="0",le="40.0",model_name="/tmp/asc/cpu-demo"} 7.0
vllm:request_prefill_time_seconds_bucket{engine="0",le="50.0",model_name="/tmp/asc/cpu-demo"} 7.0
vllm:request_prefill_time_seconds_bucket{engine="0",le="60.0",model_name="/tmp/asc/cpu-demo"} 7.0
vllm:request_prefill_time_seconds_bucket{engine="0",le="120.0",model_name="/tmp/asc/cpu-demo"} 7.0
vllm:request_prefill_time_seconds_bucket{engine="0",le="240.0",model_name="/tmp/asc/cpu-demo"} 7.0
vllm:request_prefill_time_seconds_bucket{engine="0",le="480.0",model_name="/tmp/asc/cpu-demo"} 7.0
vllm:request_prefill_time_seconds_bucket{engine="0",le="960.0",model_name="/tmp/asc/cpu-demo"} 7.0
vllm:request_prefill_time_seconds_bucket{engine="0",le="1920.0",model_name="/tmp/asc/cpu-demo"} 7.0
vllm:request_prefill_time_seconds_bucket{engine="0",le="7680.0",model_name="/tmp/asc/cpu-demo"} 7.0
vllm:request_prefill_time_seconds_bucket{engine="0",le="+Inf",model_name="/tmp/asc/cpu-demo"} 7.0
vllm:request_prefill_time_seconds_count{engine="0",model_name="/tmp/asc/cpu-demo"} 7.0
vllm:request_prefill_time_seconds_sum{engine="0",model_name="/tmp/asc/cpu-demo"} 0.5461424369950691
"""


QUEUE = "vllm:request_queue_time_seconds"
PREFILL = "vllm:request_prefill_time_seconds"


@pytest.fixture
def summary() -> dict[str, float]:
    return summarize_server(parse_scrape(BEFORE), parse_scrape(AFTER))


def test_prefill_quantiles_all_in_the_first_bucket_are_bounds(summary):
    # Six prefills, each under 0.3 s (mean 87 ms): interpolated, their p95 reads 0.285 s.
    window = parse_scrape(AFTER).histograms[PREFILL].minus(parse_scrape(BEFORE).histograms[PREFILL])
    assert window.count == 6 and window.quantile(0.95) == pytest.approx(0.285)
    for q in (50, 95, 99):
        assert summary[f"server_prefill_p{q}_at_most_s"] == 0.3
        assert f"server_prefill_p{q}_s" not in summary
    assert summary["server_prefill_mean_s"] == pytest.approx(0.5210137419962848 / 6)


def test_queue_quantiles_past_the_first_bucket_stay_figures(summary):
    # Queue times over the window: 3 of 6 up to 0.3 s, 2 in (1.0, 1.5], 1 in (2.0, 2.5].
    assert summary["server_queue_p50_at_most_s"] == 0.3
    assert "server_queue_p50_s" not in summary
    # Ranks 5.7 and 5.94 of 6 in the bucket from 2.0 (5 below) to 2.5 (6).
    assert summary["server_queue_p95_s"] == pytest.approx(2.0 + 0.5 * 0.7)
    assert summary["server_queue_p99_s"] == pytest.approx(2.0 + 0.5 * 0.94)
    assert "server_queue_p95_at_most_s" not in summary
    assert summary["server_queue_mean_s"] == pytest.approx(4.273141148001741 / 6)


def test_ttft_quantiles_above_its_first_bucket_are_interpolated(summary):
    # TTFT's first bucket is 0 to 1 ms; over the window 2 up to 0.1 s, 3 up to 0.25, 6 up to 2.5.
    assert not any(name.startswith("server_ttft") and "at_most" in name for name in summary)
    assert summary["server_ttft_p50_s"] == pytest.approx(0.25)
    assert summary["server_ttft_p95_s"] == pytest.approx(1.0 + 1.5 * (5.7 - 3) / 3)
    assert summary["server_ttft_p99_s"] == pytest.approx(1.0 + 1.5 * (5.94 - 3) / 3)
