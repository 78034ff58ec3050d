"""Traces: the request trace model, its file formats and readers, concurrency traces, the
replay window (workload), traces rebuilt from Prometheus, and a trace's profile and plot.

The names offered to code outside tuner (``benchmarks/``, an embedding program) are in
``__all__``, each imported from its module when first used (``tuner.face``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tuner.face import lazy

if TYPE_CHECKING:
    from tuner.traces.formats import load_trace
    from tuner.traces.model import Request, busiest_window
    from tuner.traces.workload import at_rate, build_workload, model_info

_FACE = {
    "Request": "tuner.traces.model",
    "at_rate": "tuner.traces.workload",
    "build_workload": "tuner.traces.workload",
    "busiest_window": "tuner.traces.model",
    "load_trace": "tuner.traces.formats",
    "model_info": "tuner.traces.workload",
}

__all__ = [
    "Request",
    "at_rate",
    "build_workload",
    "busiest_window",
    "load_trace",
    "model_info",
]

__getattr__, __dir__ = lazy(__name__, _FACE)
