"""The load of the capacity and goodput studies on vLLM's CPU build, in units of what this
machine serves: one engine of vLLM's defaults started once per test run, requests of the window's
mean shape sent to it one at a time (``served_alone``), and the study's rate, SLOs and windows
derived from that (``calibrated``). ``tests/conftest.py``'s ``cap_load`` fixture measures it once
for the test process; the tests that read it share one xdist group, so one process measures it.
"""

from __future__ import annotations

import dataclasses
import statistics
from pathlib import Path
from typing import Any

import yaml

from tuner.engine.dummy_model import SHAPES, write_model
from tuner.engine.process import Engine
from tuner.load.http import ReplaySettings
from tuner.load.open_loop import replay_in_process
from tuner.study.capacity.probes import MIN_WINDOW_REQUESTS
from tuner.traces.formats import load_trace
from tuner.traces.model import Request, Trace
from tuner.traces.workload import TraceWindow, build_workload

REPO = Path(__file__).resolve().parent.parent

# The study's trace: 2 requests a second for 20 s, prompts of 60 to 140 tokens and outputs of
# 100 to 198; its window is the first 10 s (a peak of 2 req/s). Decoding is most of a request's
# time on any machine, and decoding is what more sequences share. (With the conversation
# trace's prompts, 1,535 tokens on average, prefill was 1.0 to 3.5 s of a request's 2.0 to 7.1 s
# alone on a 2-core machine busy with other work, which leaves max-num-seqs 16 about twice what
# 1 carries at most: one step of the search.)
CAP_TRACE = [(0.5 * i, 60 + (37 * i) % 81, 100 + (53 * i) % 101) for i in range(40)]
CAP_WINDOW_S = 10.0
MAX_MODEL_LEN = 4096  # studies/cap.yaml's
# Requests sent to the calibration server before the timed ones: the CPU build's first requests
# are slower.
WARMUP = 2
TIMED = 5


@dataclasses.dataclass(frozen=True)
class Alone:
    """What this machine serves now: requests of the window's mean shape sent one at a time to
    vLLM's defaults (the study's baseline)."""

    e2e_s: float  # the median end-to-end latency
    client_lag_s: float  # the longest that tuner's own client was held up meanwhile
    healthy_s: float  # how long that server took to start


def served_alone(model: Path, engine_args: dict, shape: Request, workdir: Path) -> Alone:
    with Engine(str(model), engine_args, workdir) as engine:
        healthy_s = engine.wait_healthy(timeout_s=900)
        settings = ReplaySettings(model=str(model), vocab_size=SHAPES["cpu-tiny"].vocab_size)
        e2e_s, lag_s = [], []
        for seed in range(WARMUP + TIMED):  # a prompt of its own each: no prefix-cache hit
            result = replay_in_process(
                engine.base_url, [shape], dataclasses.replace(settings, seed=seed)
            )
            (served,) = result.results
            assert served.ok and served.e2e_s is not None, served.error
            if seed >= WARMUP:
                e2e_s.append(served.e2e_s)
                lag_s.append(result.client_lag_max_s)
    return Alone(statistics.median(e2e_s), max(lag_s), healthy_s)


def calibrated(alone: Alone, peak_req_per_s: float, window: Trace) -> dict[str, Any]:
    """The study's load, SLOs and windows in units of what this machine serves alone: S, one
    request's end-to-end latency, and L, the longest hold-up of tuner's client (it delays what
    the client reads; beside vLLM and two busy processes it reached 1.8 s on 2 cores).

    The search starts at 2/S: twice what max-num-seqs 1 serves one request at a time, so its
    queue, and with it TTFT, grows by S every S; 16 sequences sharing their decoding carry it
    with room to spare. TTFT p95 within S + 2L leaves room for hold-ups, not for that queue,
    and windows of twice that SLO let the queue pass it. Windows of 10 S at least, so that the
    search's floor (10 requests a window) is 1/S at most, half the start. TPOT within ten times
    a request's time per output token alone, plus a hold-up over the shortest output; end to
    end within 10 S + 2L: the SLO that max-num-seqs 1 misses first is TTFT's.
    """
    s, lag = alone.e2e_s, alone.client_lag_s
    ttft_s = s + 2 * lag
    outputs = window.output_tokens
    return {
        "time_scale": peak_req_per_s * s / 2,
        "slos": {
            "ttft_p95_s": ttft_s,
            "tpot_p95_s": 10 * s / float(outputs.mean()) + 2 * lag / int(outputs.min()),
            "e2e_p99_s": 10 * s + 2 * lag,
        },
        "capacity_probe_s": max(MIN_WINDOW_REQUESTS * s, 2 * ttft_s),
    }


@dataclasses.dataclass(frozen=True)
class CapLoad:
    """What a capacity or goodput study on vLLM's CPU build shares: ``cpu-tiny`` with saved
    weights, the trace file, its window, ``studies/cap.yaml``'s spec, what the defaults served
    alone and the load calibrated from it."""

    model: Path
    trace: Path
    workload: TraceWindow
    spec: dict[str, Any]
    alone: Alone
    load: dict[str, Any]

    def drained_s(self) -> float:
        """The longest one rate of the search can take: a lead-in and a window at most as long
        as its ``capacity_probe_s`` each, then its slowest request's end to end."""
        return 2 * self.load["capacity_probe_s"] + self.load["slos"]["e2e_p99_s"]


def measure_cap_load(folder: Path) -> CapLoad:
    """The trace written, ``cpu-tiny`` written and the defaults served alone, in ``folder``."""
    trace = folder / "trace.csv"
    rows = "".join(f"{t},{i},{o}\n" for t, i, o in CAP_TRACE)
    trace.write_text("timestamp,input_tokens,output_tokens\n" + rows)
    workload = build_workload(load_trace(trace), CAP_WINDOW_S, 1.0, MAX_MODEL_LEN)
    window = workload.trace
    shape = Request(0.0, round(window.input_tokens.mean()), round(window.output_tokens.mean()))
    spec = yaml.safe_load((REPO / "studies" / "cap.yaml").read_text())
    model = write_model(folder / "models" / "cpu-tiny", "cpu-tiny")
    # The KV-cache share of the baseline: the CPU build's default 0.9 does not start here.
    baseline = {**spec["engine_args"], "gpu-memory-utilization": 0.2}
    alone = served_alone(model, baseline, shape, folder / "calibration")
    load = calibrated(alone, workload.peak_req_per_s, window)
    return CapLoad(model, trace, workload, spec, alone, load)
