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
    # The failed request counts as a miss at the window's end, 4 - 3.004 = 0.996 s after its
    # send, in TTFT and end to end; with no first token, it has no TPOT.
    assert summary["ttft_mean_s"] == pytest.approx((0.1 + 0.3 + 0.2 + 0.996) / 4)
    assert summary["ttft_p50_s"] == pytest.approx(0.25)
    # numpy's linear interpolation between 0.3 and 0.996 at rank 0.99 * 3 = 2.97.
    assert summary["ttft_p99_s"] == pytest.approx(0.3 + 0.97 * 0.696)
    assert summary["tpot_mean_s"] == pytest.approx(0.3)
    assert summary["tpot_p50_s"] == pytest.approx(0.3)
    assert summary["e2e_mean_s"] == pytest.approx((0.5 + 1.3 + 0.2 + 0.996) / 4)
    # Between 0.996 and 1.3 at rank 0.95 * 3 = 2.85.
    assert summary["e2e_p95_s"] == pytest.approx(0.996 + 0.85 * 0.304)
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


# Two replays of the same 100 requests, sent 0.1 s apart, each 11 tokens long: in one every
# request is served, in the other the 10% slowest time out. Spread, not sorted: request i has
# rank (37 i) mod 100 among them.
RANKS = [(37 * i) % 100 for i in range(100)]


def served(i: int) -> RequestResult:
    ttft_s = 0.2 + 0.03 * RANKS[i]
    tpot_s = 0.05 + 0.001 * RANKS[i]
    return ok(0.1 * i, 0.1 * i, ttft_s=ttft_s, e2e_s=ttft_s + 10 * tpot_s, output_tokens=11)


SERVED = [served(i) for i in range(100)]
# The window of the replay that served everything; the other, which gave up on the slowest
# ones, is given the same (in truth it ran on until they timed out, at least as long).
DURATION_S = max(r.sent_s + (r.e2e_s or 0.0) for r in SERVED)


def timed_out(r: RequestResult, after_first_token: bool) -> RequestResult:
    return RequestResult(
        r.scheduled_s,
        r.sent_s,
        r.input_tokens,
        r.output_tokens,
        ttft_s=r.ttft_s if after_first_token else None,
        tokens_received=3 if after_first_token else 0,
        error="ReadTimeout: timed out",
    )


def slowest_time_out(after_first_token: bool) -> list[RequestResult]:
    return [
        timed_out(r, after_first_token) if rank >= 90 else r
        for r, rank in zip(SERVED, RANKS, strict=True)
    ]


TAIL_KEYS = [f"{m}_{s}_s" for m in ("ttft", "e2e") for s in ("mean", "p50", "p95", "p99")]


@pytest.mark.parametrize("key", TAIL_KEYS)
def test_timing_out_the_slowest_requests_does_not_improve_the_tails(key):
    """Queued so long they time out before their first token: a miss in TTFT and end to end."""
    served = summarize_client(SERVED, DURATION_S)
    gave_up = summarize_client(slowest_time_out(after_first_token=False), DURATION_S)
    assert gave_up["error_rate"] == pytest.approx(0.1)
    assert gave_up[key] >= served[key]


@pytest.mark.parametrize("key", [k.replace("ttft", "tpot") for k in TAIL_KEYS if "ttft" in k])
def test_timing_out_the_slowest_decodes_does_not_improve_the_tpot_tail(key):
    """Failed after their first token: counted as if their last tokens came at the window's end."""
    served = summarize_client(SERVED, DURATION_S)
    gave_up = summarize_client(slowest_time_out(after_first_token=True), DURATION_S)
    assert gave_up[key] >= served[key]
    # The first tokens they did receive are measured TTFTs, and count as such.
    assert gave_up[key.replace("tpot", "ttft")] == pytest.approx(
        served[key.replace("tpot", "ttft")]
    )


def test_a_failed_request_counts_at_the_window_s_end():
    results = [
        ok(0.0, 0.0, ttft_s=0.5, e2e_s=1.0, output_tokens=3),  # tpot 0.25
        # HTTP 500 at once, 2 s before the window's end: 2 s to first token and to the end.
        RequestResult(2.0, 2.0, 10, 3, error="HTTP 500: boom"),
        # First token at 1.5 s, then the connection dropped: TTFT 0.5 s as measured; end to
        # end 3 s (the window's end); tpot (3 - 0.5) / 2.
        RequestResult(1.0, 1.0, 10, 3, ttft_s=0.5, tokens_received=1, error="RemoteProtocolError"),
        # A complete body, one token short, 0.7 s from the first token to the second: TTFT as
        # measured; end to end 1 s (the window's end); tpot the 0.7 s it showed, more than the
        # (1 - 0.2) / 2 its last token at the window's end would make.
        RequestResult(3.0, 3.0, 10, 3, ttft_s=0.2, e2e_s=0.9, tokens_received=2, error="short"),
    ]
    summary = summarize_client(results, duration_s=4.0)
    assert summary["requests_ok"] == 1 and summary["error_rate"] == 0.75
    assert summary["ttft_mean_s"] == pytest.approx((0.5 + 2.0 + 0.5 + 0.2) / 4)
    assert summary["e2e_mean_s"] == pytest.approx((1.0 + 2.0 + 3.0 + 1.0) / 4)
    assert summary["tpot_mean_s"] == pytest.approx((0.25 + 1.25 + 0.7) / 3)
    assert summary["throughput_req_per_s"] == pytest.approx(0.25)


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
    # Half of the four in the first bucket (up to 1 s): its p50 is bounded, not measured.
    assert summary["server_e2e_p50_at_most_s"] == 1.0
    assert "server_e2e_p50_s" not in summary
    # The older name of inter-token latency is picked up.
    assert summary["server_itl_mean_s"] == pytest.approx(0.03)
    assert summary["server_itl_p50_s"] == pytest.approx(0.03)
    assert summary["server_prompt_tokens"] == 400.0
    assert "server_preemptions" not in summary
    assert "server_queue_mean_s" not in summary


def test_a_histogram_whose_first_bucket_is_unbounded_gives_no_quantile():
    text = (
        "# TYPE vllm:time_to_first_token_seconds histogram\n"
        'vllm:time_to_first_token_seconds_bucket{le="+Inf"} 4.0\n'
        "vllm:time_to_first_token_seconds_count 4.0\n"
        "vllm:time_to_first_token_seconds_sum 2.0\n"
    )
    summary = summarize_server(parse_scrape(""), parse_scrape(text))
    assert summary == {"server_ttft_mean_s": 0.5}


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
