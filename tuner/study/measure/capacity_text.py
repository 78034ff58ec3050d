"""What a capacity study says in the user's terms: req/s per server, as a multiple of the
trace's peak rate, and the servers that peak needs. Pure: builds text from rates (a capacity
study's lines from a trial's attributes are ``tuner.study.measure.objective``'s)."""

from __future__ import annotations

import math


def servers_for(peak_req_per_s: float, capacity_req_per_s: float) -> int | None:
    """Servers of this capacity that carry the peak, if load splits evenly; None at capacity 0.

    The two rates as ``servers_line`` shows them (``num``) divided and rounded up, so that its
    ``ceil(13 / 13)`` is 1 where the rates were 12.97 and 12.96.
    """
    if capacity_req_per_s <= 0:
        return None
    return max(1, math.ceil(float(num(peak_req_per_s)) / float(num(capacity_req_per_s)) - 1e-9))


def num(value: float) -> str:
    """Three significant digits, never in exponent form: 0.123, 1.5, 11.2, 257, 1234."""
    return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"


def servers_line(capacity_req_per_s: float, peak_req_per_s: float | None, label: str) -> str:
    """How many servers like ``label`` carry the peak rate, with the division shown."""
    if not peak_req_per_s:
        return "servers for the peak: n/a (no peak rate known)"
    count = servers_for(peak_req_per_s, capacity_req_per_s)
    if count is None:
        return f"servers for the peak ({num(peak_req_per_s)} req/s): n/a, {label} met no rate"
    return (
        f"servers for the peak ({num(peak_req_per_s)} req/s): {count} like {label} "
        f"(ceil({num(peak_req_per_s)} / {num(capacity_req_per_s)}), if the load splits evenly)"
    )
