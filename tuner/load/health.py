"""Whether tuner's own client kept up with a window, from what the client recorded of itself.

A client short of CPU reads tokens late (its TTFT and decode figures grow by its own delay) and
sends requests late (the load offered is not the trace's). Against a stand-in server with known
latencies (``benchmarks/replay_fidelity.py``), the client's TTFT p95 error followed its event
loop's lag p99 closely; a trial whose client fell behind by more than the tolerance is flagged,
and its figures are not used to rank. A late send is weighed against the gap between arrivals
instead where that is larger (``send_tolerance_s``). In a capacity search, a failed window whose
client fell behind ends the search unresolved, unless an SLO was missed by more than the client's
lateness could explain (``client_to_blame``): then the failure is the server's and the search
goes on.

How late each request's bytes were written (``write_lag_*``) is recorded but does not flag a
window. On the H100 host, against a real vLLM at 13 req/s, it was 4.5 to 7 ms at p99 in 15
windows of 15 while the client used 0.1 of a core, its loop lag p99 was 1 to 2 ms and its send
lag p99 1.3 to 2.6 ms; and every replay-fidelity row whose TTFT error missed its bound had a send
lag p99 over the tolerance too (``benchmarks/results/h100/``, ``replay-fidelity/``).
"""

from __future__ import annotations

from collections.abc import Mapping

# The most tuner's client may add to a latency before a window's figures are not trusted: the
# TTFT p95 error the replay-fidelity target allows.
CLIENT_TOLERANCE_S = 0.005
# Send lag flags a window only beyond the larger of the tolerance and this share of the mean gap
# between arrivals: a request sent late is timed from its send, so below that the server still
# saw the trace's load (benchmarks/results/h100-code-7b/).
SEND_GAP_SHARE = 0.1
# The figure, user attribute and constraint that flag a window whose client fell behind.
CLIENT_BEHIND = "client_behind"
# A client process at this share of a core or more has no room left for bursts.
CLIENT_CPU_LIMIT = 0.9
# A window failed while the client fell behind is still the server's failure where a latency
# missed its SLO by more than this many times the client's lag p99 (benchmarks/results/h100/).
SERVER_MISS_FACTOR = 2.0


def client_behind(
    figures: Mapping[str, float], tolerance_s: float = CLIENT_TOLERANCE_S
) -> str | None:
    """Why the client fell behind in a window with these figures, or None if it kept up."""
    reasons = []
    lag = figures.get("client_lag_p99_s", 0.0)
    if lag > tolerance_s:
        reasons.append(f"its event loop ran {lag * 1000:.0f} ms late (p99)")
    late = figures.get("send_lag_p99_s", 0.0)
    late_limit_s = send_tolerance_s(figures, tolerance_s)
    if late > late_limit_s:
        within = f"; {late_limit_s * 1000:.0f} ms allowed" if late_limit_s > tolerance_s else ""
        reasons.append(f"requests went out {late * 1000:.0f} ms after their time (p99{within})")
    cpu = figures.get("client_cpu_max", 0.0)
    if cpu >= CLIENT_CPU_LIMIT:
        reasons.append(f"a client process used {cpu:.2f} of a core")
    if not reasons:
        return None
    return (
        "tuner's client fell behind: "
        + "; ".join(reasons)
        + f" (tolerance {tolerance_s * 1000:g} ms; more client processes: --client-procs)"
    )


def send_tolerance_s(
    figures: Mapping[str, float], tolerance_s: float = CLIENT_TOLERANCE_S
) -> float:
    """How late (p99) a window's requests may go out before its load is not the trace's: the
    tolerance, or ``SEND_GAP_SHARE`` of the mean gap between its arrivals where that is larger."""
    return max(tolerance_s, SEND_GAP_SHARE * figures.get("arrival_gap_mean_s", 0.0))


def missed_beyond_lag(
    figures: Mapping[str, float], slos: Mapping[str, float], factor: float = SERVER_MISS_FACTOR
) -> list[str]:
    """The latency SLOs (``*_s``) that these figures missed by more than ``factor`` times the
    client's lateness: misses that tuner's client falling behind cannot explain."""
    lateness = max(figures.get("client_lag_p99_s", 0.0), figures.get("send_lag_p99_s", 0.0))
    return [
        metric
        for metric, limit in slos.items()
        if metric.endswith("_s")
        and isinstance(value := figures.get(metric), int | float)
        and value - factor * lateness > limit
    ]


def client_to_blame(
    figures: Mapping[str, float],
    slos: Mapping[str, float],
    passed: bool,
    tolerance_s: float = CLIENT_TOLERANCE_S,
) -> str | None:
    """Why a window's result may be tuner's client's: it fell behind (``client_behind``), and
    the window passed or missed no SLO by more than the client's lateness explains. None where
    the client kept up, or the window failed beyond its lateness (the server's failure)."""
    behind = client_behind(figures, tolerance_s)
    if behind and not passed and missed_beyond_lag(figures, slos):
        return None
    return behind
