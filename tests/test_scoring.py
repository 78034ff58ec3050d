"""Scoring: the weighted sum of tails over their SLOs, and SLOs as constraints."""

from __future__ import annotations

import pytest

from tuner.load.metrics import RequestResult, summarize_client
from tuner.study.measure.scoring import (
    FAILED,
    FAILED_SCORE,
    Criteria,
    Miss,
    Verdict,
    score,
    verdict,
)

SLOS = {"ttft_p95_s": 2.0, "e2e_p99_s": 20.0}
WEIGHTS = {"ttft_p95_s": 1.0, "e2e_p99_s": 2.0}
CRITERIA = Criteria(SLOS, WEIGHTS)


def test_feasible_trial_by_hand():
    result = score({"ttft_p95_s": 1.0, "e2e_p99_s": 10.0, "error_rate": 0.0}, CRITERIA)
    assert result.value == pytest.approx(1.0 * 1.0 / 2.0 + 2.0 * 10.0 / 20.0)
    assert result.constraints == {
        "slo_ttft_p95_s": pytest.approx(-0.5),
        "slo_e2e_p99_s": pytest.approx(-0.5),
        "error_rate": 0.0,
    }
    assert result.feasible
    assert result.violations == []


def test_exactly_at_the_slo_is_feasible():
    result = score({"ttft_p95_s": 2.0, "e2e_p99_s": 20.0, "error_rate": 0.0}, CRITERIA)
    assert result.feasible
    assert result.value == pytest.approx(3.0)


def test_missed_slo_is_infeasible_by_its_fraction():
    result = score({"ttft_p95_s": 3.0, "e2e_p99_s": 10.0, "error_rate": 0.0}, CRITERIA)
    assert not result.feasible
    assert result.violations == ["slo_ttft_p95_s"]
    assert result.constraints["slo_ttft_p95_s"] == pytest.approx(0.5)
    # Infeasible trials keep their real score, so TPE learns from them.
    assert result.value == pytest.approx(1.5 + 1.0)


def test_errors_over_the_allowed_rate_are_infeasible():
    metrics = {"ttft_p95_s": 1.0, "e2e_p99_s": 10.0, "error_rate": 0.1}
    assert not score(metrics, CRITERIA).feasible
    assert score(metrics, CRITERIA).violations == ["error_rate"]
    assert score(metrics, Criteria(SLOS, WEIGHTS, 0.1)).feasible
    assert not score(metrics, Criteria(SLOS, WEIGHTS, 0.05)).feasible


def test_missing_error_rate_counts_as_all_failed():
    result = score({"ttft_p95_s": 1.0, "e2e_p99_s": 10.0}, Criteria(SLOS, WEIGHTS, 0.5))
    assert result.constraints["error_rate"] == 0.5
    assert not result.feasible


def test_missing_metric_misses_its_slo_and_fails_the_score():
    result = score({"e2e_p99_s": 10.0, "error_rate": 0.0}, CRITERIA)
    assert result.constraints["slo_ttft_p95_s"] == 1.0
    assert not result.feasible
    assert result.value == FAILED_SCORE


def test_weights_change_the_ranking():
    fast_start = {"ttft_p95_s": 0.5, "e2e_p99_s": 18.0, "error_rate": 0.0}
    fast_finish = {"ttft_p95_s": 1.5, "e2e_p99_s": 8.0, "error_rate": 0.0}
    ttft_first = {"ttft_p95_s": 10.0, "e2e_p99_s": 1.0}
    e2e_first = {"ttft_p95_s": 1.0, "e2e_p99_s": 10.0}
    assert (
        score(fast_start, Criteria(SLOS, ttft_first)).value
        < score(fast_finish, Criteria(SLOS, ttft_first)).value
    )
    assert (
        score(fast_start, Criteria(SLOS, e2e_first)).value
        > score(fast_finish, Criteria(SLOS, e2e_first)).value
    )


def test_a_zero_weight_constrains_but_does_not_score():
    weights = {"ttft_p95_s": 1.0, "e2e_p99_s": 0.0}
    result = score(
        {"ttft_p95_s": 1.0, "e2e_p99_s": 30.0, "error_rate": 0.0}, Criteria(SLOS, weights)
    )
    assert result.value == pytest.approx(0.5)
    assert result.violations == ["slo_e2e_p99_s"]


def test_failed_engine_score_is_infeasible():
    assert not FAILED.feasible
    assert FAILED.value == FAILED_SCORE


def test_verdict_of_a_feasible_trial_meets_the_slos():
    metrics = {"ttft_p95_s": 1.0, "e2e_p99_s": 10.0, "error_rate": 0.0}
    assert verdict(score(metrics, CRITERIA).constraints, metrics) == Verdict(True, ())


def test_verdict_recovers_each_missed_slo_it_was_judged_by():
    metrics = {"ttft_p95_s": 4.561, "e2e_p99_s": 10.0, "error_rate": 0.25}
    judged = score(metrics, Criteria(SLOS, WEIGHTS, 0.1))
    result = verdict(judged.constraints, metrics)
    assert not result.meets_slos
    ttft, errors = result.misses
    assert ttft.metric == "ttft_p95_s" and ttft.measured == 4.561
    assert ttft.limit == pytest.approx(2.0)
    assert errors.metric == "error_rate" and errors.measured == 0.25
    assert errors.limit == pytest.approx(0.1)


def test_verdict_of_an_unmeasured_metric_and_a_failed_engine():
    judged = score({"e2e_p99_s": 10.0, "error_rate": 0.0}, CRITERIA)
    assert verdict(judged.constraints, {}).misses == (Miss("ttft_p95_s", None, None),)
    assert verdict(FAILED.constraints, {}) == Verdict(False, (Miss("failed", None, None),))


def replayed(slowest_time_out: bool) -> list[RequestResult]:
    """20 requests sent 1 s apart, 0.5 s to their first token, but two queued for 5 s; an engine
    that gives up on those two (they time out) against one that serves them."""
    results = []
    for i in range(20):
        ttft_s = 5.0 if i in (3, 11) else 0.5
        if slowest_time_out and ttft_s == 5.0:
            results.append(RequestResult(i, i, 10, 5, error="ReadTimeout: timed out"))
        else:
            results.append(RequestResult(i, i, 10, 5, ttft_s, ttft_s + 1.0, 5))
    return results


def test_timing_out_the_slowest_requests_does_not_score_better():
    """With errors allowed, failing the slowest requests must not turn a miss into a win."""
    served = score(summarize_client(replayed(False), 20.5), Criteria(SLOS, WEIGHTS, 0.1))
    gave_up = score(summarize_client(replayed(True), 20.5), Criteria(SLOS, WEIGHTS, 0.1))
    assert served.violations == ["slo_ttft_p95_s"]
    assert gave_up.violations == ["slo_ttft_p95_s"]
    assert gave_up.value >= served.value
    # The errors are held to the allowed rate as ever: two failed of 20 is the 10% allowed.
    assert gave_up.constraints["error_rate"] == 0.0
