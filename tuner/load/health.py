"""Whether tuner's own client kept up with a window, from what the client recorded of itself.

A client short of CPU reads tokens late (its TTFT and decode figures grow by its own delay) and
sends requests late (the load offered is not the trace's). Against a stand-in server with known
latencies (``benchmarks/replay_fidelity.py``), the client's TTFT p95 error followed its event
loop's lag p99 closely; a trial whose client fell behind by more than the tolerance is flagged,
and its figures are not used to rank.

How late each request's bytes were written (``write_lag_*``) is recorded but does not flag a
window. On the H100 host, against a real vLLM at 13 req/s, it was 4.5 to 7 ms at p99 in 15
windows of 15 while the client used 0.1 of a core, its loop lag p99 was 1 to 2 ms and its send
lag p99 1.3 to 2.6 ms; and every replay-fidelity row whose TTFT error missed its bound had a send
lag p99 over the tolerance too (``benchmarks/results/h100.md``, ``replay-fidelity.md``).
"""

from __future__ import annotations

from collections.abc import Mapping

# The most tuner's client may add to a latency before a window's figures are not trusted: the
# TTFT p95 error the replay-fidelity target allows.
CLIENT_TOLERANCE_S = 0.005
# The figure, user attribute and constraint that flag a window whose client fell behind.
CLIENT_BEHIND = "client_behind"
# A client process at this share of a core or more has no room left for bursts.
CLIENT_CPU_LIMIT = 0.9


def client_behind(
    figures: Mapping[str, float], tolerance_s: float = CLIENT_TOLERANCE_S
) -> str | None:
    """Why the client fell behind in a window with these figures, or None if it kept up."""
    reasons = []
    lag = figures.get("client_lag_p99_s", 0.0)
    if lag > tolerance_s:
        reasons.append(f"its event loop ran {lag * 1000:.0f} ms late (p99)")
    late = figures.get("send_lag_p99_s", 0.0)
    if late > tolerance_s:
        reasons.append(f"requests went out {late * 1000:.0f} ms after their time (p99)")
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
