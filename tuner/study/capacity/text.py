"""What a capacity study says in the user's terms: req/s per server, as a multiple of the
trace's peak rate, and the servers that peak needs; for a server of several GPUs (its layout,
``tuner.study.plan.layouts``), its req/s per GPU and the GPUs that peak needs. Pure: builds
text from rates (a capacity study's lines from a trial's attributes are
``tuner.study.result.words``')."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from tuner.study.plan.layouts import Layout, per_gpu
from tuner.study.store.record import CAPACITY_ATTR, VLLM_DEFAULTS

# vLLM's default layout: one GPU a server.
ONE_GPU = Layout()

# The figures said of vLLM's defaults at another configuration's capacity.
COMPARED_FIGURES = (
    ("p95 TTFT", "ttft_p95_s", 1000.0, "ms"),
    ("p95 TPOT", "tpot_p95_s", 1000.0, "ms"),
    ("p99 end-to-end", "e2e_p99_s", 1000.0, "ms"),
)


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


def servers_line(
    capacity_req_per_s: float,
    peak_req_per_s: float | None,
    label: str,
    layout: Layout = ONE_GPU,
) -> str:
    """How many servers like ``label`` carry the peak rate, with the division shown; for a
    server on several GPUs (``layout``), the GPUs they take and what one carries per GPU."""
    if not peak_req_per_s:
        return "servers for the peak: n/a (no peak rate known)"
    count = servers_for(peak_req_per_s, capacity_req_per_s)
    if count is None:
        return f"servers for the peak ({num(peak_req_per_s)} req/s): n/a, {label} met no rate"
    line = (
        f"servers for the peak ({num(peak_req_per_s)} req/s): {count} like {label} "
        f"(ceil({num(peak_req_per_s)} / {num(capacity_req_per_s)}), if the load splits evenly)"
    )
    if layout.gpus == 1:
        return line
    return (
        f"{line}, {count * layout.gpus} GPUs: one server ({layout}) carries "
        f"{num(capacity_req_per_s)} req/s, {num(per_gpu(capacity_req_per_s, layout))} per GPU"
    )


def capacity_of(attrs: Mapping[str, Any] | None) -> float | None:
    """A trial's measured capacity in req/s from its figures (``TrialRecord.figures``); None
    where it has none."""
    value = None if attrs is None else attrs.get(CAPACITY_ATTR)
    return float(value) if isinstance(value, int | float) else None


def _req(value: float | None) -> str:
    return "n/a" if value is None else f"{num(value)} req/s"


def headline(
    chosen: Mapping[str, Any],
    other: Mapping[str, Any] | None,
    peak_req_per_s: float | None,
    other_label: str = "defaults",
    what: str = "capacity",
) -> str:
    """``capacity: X req/s (Yx the trace's peak rate; defaults Z req/s)``: the median
    measurements' capacities (``what``: the rate's name)."""
    capacity = capacity_of(chosen) or 0.0
    parts = []
    if peak_req_per_s:
        parts.append(f"{num(capacity / peak_req_per_s)}x the trace's peak rate")
    if other is not None:
        parts.append(f"{other_label} {_req(capacity_of(other))}")
    suffix = f" ({'; '.join(parts)})" if parts else ""
    return f"{what}: {_req(capacity)}{suffix}"


def table_rows(
    chosen: Mapping[str, Any],
    baseline: Mapping[str, Any] | None,
    peak_req_per_s: float | None,
    what: str = "capacity",
    layouts: tuple[Layout, Layout] = (ONE_GPU, ONE_GPU),
) -> list[tuple[str, str, str]]:
    """``(row, chosen, baseline)`` for the end table: the rate (named ``what``), multiple of
    peak, servers; where either server (its layout of ``layouts``) is on several GPUs, also its
    rate per GPU and the GPUs for the peak."""

    def multiple(attrs: Mapping[str, Any] | None) -> str:
        capacity = capacity_of(attrs)
        if capacity is None or not peak_req_per_s:
            return "n/a"
        return f"{num(capacity / peak_req_per_s)}x"

    def servers(attrs: Mapping[str, Any] | None) -> str:
        capacity = capacity_of(attrs)
        if capacity is None or not peak_req_per_s:
            return "n/a"
        count = servers_for(peak_req_per_s, capacity)
        return "n/a" if count is None else str(count)

    def base(show: Callable[[Mapping[str, Any] | None], str]) -> str:
        return show(baseline) if baseline is not None else "n/a"

    rows = [
        (what, _req(capacity_of(chosen)), base(lambda a: _req(capacity_of(a)))),
        ("x trace peak", multiple(chosen), base(multiple)),
        ("servers for peak", servers(chosen), base(servers)),
    ]
    if max(layout.gpus for layout in layouts) == 1:
        return rows
    return [*rows, *_gpu_rows(chosen, baseline, peak_req_per_s, layouts)]


def _gpu_rows(
    chosen: Mapping[str, Any],
    baseline: Mapping[str, Any] | None,
    peak_req_per_s: float | None,
    layouts: tuple[Layout, Layout],
) -> list[tuple[str, str, str]]:
    """The end table's rows of servers on several GPUs: GPUs a server, req/s per GPU, GPUs for
    the peak."""

    def each(attrs: Mapping[str, Any] | None, layout: Layout) -> tuple[str, str, str]:
        capacity = capacity_of(attrs) if attrs is not None else None
        if capacity is None:
            return str(layout.gpus), "n/a", "n/a"
        count = servers_for(peak_req_per_s, capacity) if peak_req_per_s else None
        gpus = "n/a" if count is None else str(count * layout.gpus)
        return str(layout.gpus), _req(per_gpu(capacity, layout)), gpus

    mine = each(chosen, layouts[0])
    theirs = each(baseline, layouts[1]) if baseline is not None else ("n/a",) * 3
    names = ("GPUs a server", "per GPU", "GPUs for peak")
    return [(name, mine[i], theirs[i]) for i, name in enumerate(names)]


def compared_line(point: Mapping[str, Any], name: str = VLLM_DEFAULTS) -> str:
    """The baseline (``name``) at the finalist's capacity in the search (one window of a fresh
    measurement of it, a rate point's attributes), in one line."""
    shown = [
        f"{label} {point[key] * scale:.0f} {unit}"
        for label, key, scale, unit in COMPARED_FIGURES
        if isinstance(point.get(key), int | float)
    ]
    passed = bool(point.get("passed"))
    if name == VLLM_DEFAULTS:
        they, verdict = "they", "meet the SLOs" if passed else "miss the SLOs"
    else:
        they, verdict = "it", "meets the SLOs" if passed else "misses the SLOs"
    if not point.get("passed") and point.get("reason"):
        verdict += f" ({point['reason']})"
    return (
        f"at {num(point['rate_req_per_s'])} req/s, the finalist's capacity in the search, "
        f"{name}: {', '.join(shown)}: {they} {verdict}"
    )
