"""The PNG of ``tuner trace inspect``: arrivals per second, in flight over time, lengths.

The only plotting code; matplotlib is imported here alone, with the Agg backend.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from tuner.traces.concurrency import ConcurrencyTrace
from tuner.traces.model import Trace
from tuner.traces.profile import ServiceModel, in_flight


def _figure(rows: int) -> tuple[Any, Any]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(rows, 1, figsize=(11, 2.8 * rows), constrained_layout=True)


def plot_trace(
    trace: Trace,
    path: Path,
    window: tuple[float, float] | None = None,
    service: ServiceModel | None = None,
) -> None:
    """Arrivals per second, estimated in flight, and both length histograms, as a PNG."""
    service = service or ServiceModel()
    fig, (rate_ax, flight_ax, length_ax) = _figure(3)
    per_second = np.bincount(np.floor(trace.arrival_s).astype(np.int64))
    rate_ax.plot(np.arange(len(per_second)), per_second, lw=0.6, color="tab:blue")
    rate_ax.set_ylabel("arrivals / s")
    rate_ax.set_title(f"{trace.source or 'trace'}: {len(trace)} requests over {trace.span_s:.0f} s")
    finish_s = trace.arrival_s + service.service_s(trace.input_tokens, trace.output_tokens)
    times_s, counts = in_flight(trace.arrival_s, finish_s)
    flight_ax.step(times_s, counts, where="post", lw=0.6, color="tab:orange")
    flight_ax.set_ylabel("in flight (est.)")
    flight_ax.set_xlabel("seconds from the first request")
    if window is not None:
        for ax in (rate_ax, flight_ax):
            ax.axvspan(window[0], window[0] + window[1], color="tab:red", alpha=0.12)
        rate_ax.text(window[0], rate_ax.get_ylim()[1] * 0.9, " busiest window", color="tab:red")
    top = max(int(trace.input_tokens.max()), int(trace.output_tokens.max()), 2)
    bins = np.unique(np.geomspace(1, top + 1, 60).astype(np.int64))
    length_ax.hist(trace.input_tokens, bins=bins, alpha=0.6, label="input tokens")
    length_ax.hist(trace.output_tokens, bins=bins, alpha=0.6, label="output tokens")
    length_ax.set_xscale("log")
    length_ax.set_xlabel("tokens")
    length_ax.set_ylabel("requests")
    length_ax.legend()
    fig.savefig(path, dpi=110)
    fig.clf()


def plot_concurrency(trace: ConcurrencyTrace, path: Path) -> None:
    """The target concurrency over time, as a PNG."""
    fig, ax = _figure(1)
    times = np.append(trace.time_s, trace.end_s)
    values = np.append(trace.concurrency, trace.concurrency[-1])
    ax.step(times, values, where="post", color="tab:orange")
    ax.set_ylabel("in flight")
    ax.set_xlabel("seconds from the first sample")
    ax.set_title(f"{trace.source or 'concurrency trace'}: measured concurrency")
    fig.savefig(path, dpi=110)
    fig.clf()
