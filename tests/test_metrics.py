"""Client-side summaries, Prometheus parsing, histogram quantiles and server-side diffs."""

from __future__ import annotations

import math

import pytest

from tuner.load.metrics import (
    Histogram,
    RequestResult,
    parse_scrape,
    summarize_client,
    summarize_gauges,
    summarize_server,
)


def ok(scheduled_s, sent_s, ttft_s, e2e_s, output_tokens=5, input_tokens=10):
    return RequestResult(
        scheduled_s,
        sent_s,
        input_tokens,
        output_tokens,
        ttft_s=ttft_s,
        e2e_s=e2e_s,
        tokens_received=output_tokens,
    )


def test_summarize_client_by_hand():
    results = [
        ok(0.0, 0.001, ttft_s=0.1, e2e_s=0.5, output_tokens=5),  # tpot 0.4 / 4 = 0.1
        ok(1.0, 1.003, ttft_s=0.3, e2e_s=1.3, output_tokens=3),  # tpot 1.0 / 2 = 0.5
        ok(2.0, 2.002, ttft_s=0.2, e2e_s=0.2, output_tokens=1),  # no tpot: one token
        RequestResult(3.0, 3.004, 10, 5, error="HTTP 500: boom"),
    ]
    summary = summarize_client(results, duration_s=4.0)
    assert summary["requests"] == 4
    assert summary["requests_ok"] == 3
    assert summary["requests_failed"] == 1
    assert summary["error_rate"] == 0.25
    assert summary["duration_s"] == 4.0
    assert summary["ttft_mean_s"] == pytest.approx(0.2)
    assert summary["ttft_p50_s"] == pytest.approx(0.2)
    # numpy's linear interpolation between 0.2 and 0.3 at rank 0.99 * 2 = 1.98.
    assert summary["ttft_p99_s"] == pytest.approx(0.298)
    assert summary["tpot_mean_s"] == pytest.approx(0.3)
    assert summary["tpot_p50_s"] == pytest.approx(0.3)
    assert summary["e2e_mean_s"] == pytest.approx(2.0 / 3)
    assert summary["e2e_p95_s"] == pytest.approx(0.5 + 0.8 * 0.9)
    # Send lag counts every request, failed or not: 1, 3, 2 and 4 ms.
    assert summary["send_lag_mean_s"] == pytest.approx(0.0025)
    assert summary["send_lag_p50_s"] == pytest.approx(0.0025)
    assert summary["throughput_req_per_s"] == pytest.approx(0.75)
    assert summary["throughput_output_tokens_per_s"] == pytest.approx(9 / 4)


def test_short_output_and_missing_e2e_are_not_ok():
    short = RequestResult(0, 0, 1, 5, ttft_s=0.1, e2e_s=0.2, tokens_received=4, error="short")
    unfinished = RequestResult(0, 0, 1, 5, ttft_s=0.1)
    assert not short.ok and short.tpot_s is None
    assert not unfinished.ok
    summary = summarize_client([short, unfinished], duration_s=1.0)
    assert summary["error_rate"] == 1.0
    assert "ttft_p50_s" not in summary
    assert summary["throughput_req_per_s"] == 0


def test_summarize_client_of_nothing():
    summary = summarize_client([], duration_s=0.0)
    assert summary == {
        "requests": 0.0,
        "requests_ok": 0.0,
        "requests_failed": 0.0,
        "error_rate": 0.0,
        "duration_s": 0.0,
    }


# Histograms: buckets 0.1 -> 2, 0.5 -> 6, 1.0 -> 8, +Inf -> 10 (cumulative), sum 7, count 10.
H = Histogram(buckets=((0.1, 2.0), (0.5, 6.0), (1.0, 8.0), (math.inf, 10.0)), sum=7.0, count=10.0)


@pytest.mark.parametrize(
    ("q", "expected"),
    [
        (0.0, 0.0),
        (0.1, 0.05),  # rank 1 in the first bucket, which starts at 0: 0 + 0.1 * 1/2
        (0.2, 0.1),  # rank 2 is the first bucket's top
        (0.5, 0.4),  # rank 5: 0.1 + (0.5 - 0.1) * (5 - 2) / (6 - 2)
        (0.7, 0.75),  # rank 7: 0.5 + 0.5 * (7 - 6) / (8 - 6)
        (0.8, 1.0),
        (0.95, 1.0),  # rank 9.5 lands in +Inf: the highest finite bound, as Prometheus does
    ],
)
def test_histogram_quantile_by_hand(q, expected):
    assert H.quantile(q) == pytest.approx(expected)


def test_histogram_mean_and_empty():
    assert H.mean == pytest.approx(0.7)
    empty = Histogram(buckets=((1.0, 0.0), (math.inf, 0.0)), sum=0.0, count=0.0)
    assert empty.mean is None
    assert empty.quantile(0.5) is None


def test_histogram_quantile_skips_empty_buckets():
    h = Histogram(buckets=((0.1, 0.0), (0.2, 0.0), (0.4, 4.0), (math.inf, 4.0)), sum=1, count=4)
    # rank 2 of 4: the 0.2 .. 0.4 bucket holds all four, halfway is 0.3.
    assert h.quantile(0.5) == pytest.approx(0.3)


SCRAPE_BEFORE = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 0.0
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="m"} 100.0
vllm:prompt_tokens_total{engine="1",model_name="m"} 50.0
# HELP vllm:prompt_tokens_created Created.
# TYPE vllm:prompt_tokens_created gauge
vllm:prompt_tokens_created{engine="0",model_name="m"} 1.7e9
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="m"} 1.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.5",model_name="m"} 2.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="1.0",model_name="m"} 2.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="m"} 2.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 2.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 0.35
# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.
# TYPE process_cpu_seconds_total counter
process_cpu_seconds_total 12.5
"""

SCRAPE_AFTER = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 2.0
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="m"} 400.0
vllm:prompt_tokens_total{engine="1",model_name="m"} 150.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="m"} 3.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.5",model_name="m"} 6.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="1.0",model_name="m"} 8.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="m"} 8.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 8.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 2.75
# HELP vllm:e2e_request_latency_seconds Histogram of end to end request latency in seconds.
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{engine="0",le="1.0",model_name="m"} 1.0
vllm:e2e_request_latency_seconds_bucket{engine="0",le="+Inf",model_name="m"} 2.0
vllm:e2e_request_latency_seconds_bucket{engine="1",le="1.0",model_name="m"} 1.0
vllm:e2e_request_latency_seconds_bucket{engine="1",le="+Inf",model_name="m"} 2.0
vllm:e2e_request_latency_seconds_count{engine="0",model_name="m"} 2.0
vllm:e2e_request_latency_seconds_count{engine="1",model_name="m"} 2.0
vllm:e2e_request_latency_seconds_sum{engine="0",model_name="m"} 3.0
vllm:e2e_request_latency_seconds_sum{engine="1",model_name="m"} 5.0
# HELP vllm:time_per_output_token_seconds Histogram of time per output token in seconds.
# TYPE vllm:time_per_output_token_seconds histogram
vllm:time_per_output_token_seconds_bucket{engine="0",le="0.01",model_name="m"} 0.0
vllm:time_per_output_token_seconds_bucket{engine="0",le="0.05",model_name="m"} 10.0
vllm:time_per_output_token_seconds_bucket{engine="0",le="+Inf",model_name="m"} 10.0
vllm:time_per_output_token_seconds_count{engine="0",model_name="m"} 10.0
vllm:time_per_output_token_seconds_sum{engine="0",model_name="m"} 0.3
"""


def test_parse_scrape_sums_labels_and_keeps_vllm_only():
    scrape = parse_scrape(SCRAPE_AFTER)
    assert scrape.values["vllm:num_requests_running"] == 5.0
    assert scrape.values["vllm:prompt_tokens_total"] == 550.0
    assert not any(name.startswith("process_") for name in scrape.values)
    e2e = scrape.histograms["vllm:e2e_request_latency_seconds"]
    assert e2e.buckets == ((1.0, 2.0), (math.inf, 4.0))
    assert (e2e.sum, e2e.count) == (8.0, 4.0)


def test_parse_scrape_drops_created_samples():
    scrape = parse_scrape(SCRAPE_BEFORE)
    assert not any(name.endswith("_created") for name in scrape.values)
    assert scrape.values["vllm:prompt_tokens_total"] == 150.0


def test_parse_scrape_of_nothing():
    scrape = parse_scrape("")
    assert not scrape.values and not scrape.histograms


def test_summarize_server_diffs_the_two_scrapes():
    summary = summarize_server(parse_scrape(SCRAPE_BEFORE), parse_scrape(SCRAPE_AFTER))
    # TTFT over the window: buckets 0.1 -> 2, 0.5 -> 4, 1.0 -> 6, +Inf -> 6; sum 2.4, count 6.
    assert summary["server_ttft_mean_s"] == pytest.approx(0.4)
    assert summary["server_ttft_p50_s"] == pytest.approx(0.1 + 0.4 * (3 - 2) / (4 - 2))
    assert summary["server_ttft_p95_s"] == pytest.approx(0.5 + 0.5 * (5.7 - 4) / (6 - 4))
    # Absent before: taken whole.
    assert summary["server_e2e_mean_s"] == pytest.approx(2.0)
    assert summary["server_e2e_p50_s"] == pytest.approx(1.0)
    # The older name of inter-token latency is picked up.
    assert summary["server_itl_mean_s"] == pytest.approx(0.03)
    assert summary["server_itl_p50_s"] == pytest.approx(0.03)
    assert summary["server_prompt_tokens"] == 400.0
    assert "server_preemptions" not in summary
    assert "server_queue_mean_s" not in summary


def test_summarize_server_of_an_idle_window_has_no_latencies():
    before = parse_scrape(SCRAPE_BEFORE)
    summary = summarize_server(before, before)
    assert "server_ttft_mean_s" not in summary
    assert "server_ttft_p50_s" not in summary
    assert summary["server_prompt_tokens"] == 0.0


def test_summarize_gauges_peak_and_mean():
    samples = [parse_scrape(SCRAPE_BEFORE), parse_scrape(SCRAPE_AFTER), parse_scrape("")]
    summary = summarize_gauges(samples)
    assert summary == {"running_peak": 5.0, "running_mean": 2.5}
