"""Where vLLM's serving limit on the story shape lies: one server probed window by window.

One command, run on the device machine by ``frontend.sh`` (which puts tuner's snapshot and this
folder's ``frontend_serve`` on ``PYTHONPATH``):

``probe``: one ``vllm serve`` of the spec's engine arguments (vLLM's defaults), then windows of
the story shape, each judged on the spec's SLOs:
  - from idle, as tuner's capacity search replays them (wait until idle, reset the prefix cache,
    replay at one rate), 20 s long and never stopped early, so that tuner's 10 s window
    ([0, 10) s), the same window without its first 2 or 4 s, and its second half can be judged
    apart;
  - ramped in: 2 s at a quarter, a half and three quarters of the rate, then the rate; judged on
    the requests sent at the full rate only;
  - under py-spy (``record --format raw --idle --threads``) of the API-server process and the
    engine-core process.
Each window records, besides tuner's figures (client and vLLM's own histograms over the window),
the CPU the API server (its main thread apart) and the engine core spent, vLLM's step count and
tokens per step (``vllm:iteration_tokens_total``), the running and waiting gauges once a second,
the kernels vLLM's JIT monitor saw compiled, a per-second TTFT timeline, and each request's
times (``requests-LABEL.json``).

Which front-end arguments move the limit, measured against vLLM's defaults on fresh engines in
turns, is ``benchmarks/ab.py`` with ``benchmarks/arms/frontend.yaml``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import yaml

from tuner.engine import Engine, Launch, LocalServer, ZygoteLauncher
from tuner.load import RequestResult, parse_scrape, replay, replay_figures, summarize_client
from tuner.study import (
    Criteria,
    RateSearch,
    StudySpec,
    TrialSetup,
    load_spec,
    measured_on,
    prepare,
    reset_prefix_cache,
    score,
    wait_idle,
)
from tuner.traces import Request, at_rate, load_trace

SERVE_MODULE = "frontend_serve"
# Far from tuner's capacity windows' seeds (tuner.study.capacity.probes.SEED_STRIDE) and from
# each other.
SEED_STRIDE = 104729
# A kernel vLLM's JIT monitor saw compiled while serving (tuner.engine.startup.LATE_JIT).
LATE_JIT = re.compile(rb"during inference: (\S+)")
ITERATION_TOKENS = "vllm:iteration_tokens_total"


class ServeLauncher:
    """tuner's zygote launcher, running ``vllm serve`` (``frontend_serve``) instead of vLLM's
    ``api_server`` module; remembers the last server it started (the API server's pid)."""

    def __init__(self, log: Path) -> None:
        self.inner = ZygoteLauncher(module=SERVE_MODULE, log=log)
        self.last: LocalServer | None = None

    def launch(self, server: Launch) -> LocalServer:
        # Every server here runs ``vllm serve`` already: ``serve_command`` changes nothing.
        self.last = self.inner.launch(dataclasses.replace(server, serve_command=False))
        return self.last

    def close(self) -> None:
        self.inner.close()


def build(
    spec_path: Path, trace_path: Path, launcher: ServeLauncher
) -> tuple[StudySpec, TrialSetup]:
    """The spec and a trial setup as ``tuner run`` builds them (``prepare``), with the
    ``vllm serve`` launcher."""
    spec = load_spec(spec_path)
    prepared = prepare(spec, load_trace(trace_path), launcher)
    print(f"window: {prepared.replay.text}", flush=True)
    # tuner run's own setup; every server here serves /reset_prefix_cache, latency study or not.
    setup = dataclasses.replace(prepared.setup, env={"VLLM_SERVER_DEV_MODE": "1"})
    return spec, setup


# --- probe: one server, windows from idle, ramped in, and under py-spy ----------------------


@dataclasses.dataclass(frozen=True)
class Window:
    label: str
    rate: float
    seconds: float
    ramped: bool = False
    pyspy_s: float = 0.0


PLAN = (
    Window("idle-50", 50, 10),
    Window("idle-80", 80, 20),
    Window("idle-110", 110, 20),
    Window("idle-140", 140, 20),
    Window("idle-170", 170, 20),
    Window("ramp-110", 110, 12, ramped=True),
    Window("ramp-140", 140, 12, ramped=True),
    Window("ramp-170", 170, 12, ramped=True),
    Window("idle-140-again", 140, 20),
    Window("spy-140", 140, 24, pyspy_s=20),
    Window("spy-60", 60, 14, pyspy_s=10),
)
# A plan for the CPU build's smoke test: the same kinds of window at a few requests a second.
CPU_PLAN = (
    Window("idle-2", 2, 8),
    Window("ramp-3", 3, 6, ramped=True),
    Window("spy-2", 2, 8, pyspy_s=4),
)
# Two configurations at the same rates (``--plan same-rate``, one probe each): where a
# request's time goes when both carry the same load; the first window warms the engine up.
SAME_RATE_PLAN = (
    Window("warm-80", 80, 10),
    Window("idle-100", 100, 20),
    Window("spy-100", 100, 24, pyspy_s=20),
    Window("idle-130", 130, 20),
)
PLANS = {"story": PLAN, "cpu": CPU_PLAN, "same-rate": SAME_RATE_PLAN}
RAMP_STEP_S = 2.0
RAMP_FRACTIONS = (0.25, 0.5, 0.75)
# Parts of a window from idle judged apart: [start, end) seconds of their scheduled sends.
PARTS = {
    "tuner_0_10": (0.0, 10.0),
    "skip2": (2.0, 12.0),
    "skip4": (4.0, 14.0),
    "late_10_20": (10.0, 20.0),
}


def window_requests(setup: TrialSetup, window: Window) -> tuple[list[Request], float]:
    """The window's requests and when its full rate starts (0 unless ramped)."""
    assert isinstance(setup.measure, RateSearch), "the spec is not a capacity study's"
    capacity = setup.measure.settings
    steps = [(window.rate * f, RAMP_STEP_S) for f in RAMP_FRACTIONS] if window.ramped else []
    steps.append((window.rate, window.seconds))
    out: list[Request] = []
    start_s = 0.0
    for rate, seconds in steps:
        part = at_rate(capacity.requests, capacity.period_s, rate, seconds)
        out += [dataclasses.replace(r, arrival_s=r.arrival_s + start_s) for r in part]
        start_s += seconds
    return out, start_s - window.seconds


def server_processes(api_pid: int) -> dict[str, list[int]]:
    """The server's processes: API servers (the launched process and any ``ApiServer`` child)
    and engine cores, by their process titles."""
    root = psutil.Process(api_pid)
    found: dict[str, list[int]] = {"api": [api_pid], "engine_core": [], "other": []}
    for child in root.children(recursive=True):
        try:
            title = " ".join(child.cmdline()) + " " + child.name()
        except psutil.Error:
            continue
        if "EngineCore" in title or "EngineCor" in title:
            found["engine_core"].append(child.pid)
        elif "APIServer" in title or "ApiServer" in title or "spawn_main" in title:
            found["api"].append(child.pid)
        else:
            found["other"].append(child.pid)
    return found


def serving_processes(procs: dict[str, list[int]]) -> dict[str, int]:
    """The processes to watch by role: the API servers that serve requests (with
    ``api-server-count`` above 1 the launched process only manages its ``ApiServer_N``
    children: ``api``, ``api_2``, ...) and the engine core."""
    api = procs["api"][1:] or procs["api"][:1]
    watched = {("api" if i == 0 else f"api_{i + 1}"): pid for i, pid in enumerate(api)}
    if procs["engine_core"]:
        watched["engine_core"] = procs["engine_core"][0]
    return watched


def cpu_seconds(pid: int) -> tuple[float, float]:
    """CPU seconds of the process and of its main thread."""
    try:
        process = psutil.Process(pid)
        times = process.cpu_times()
        main = next((t for t in process.threads() if t.id == pid), None)
    except psutil.Error:
        return math.nan, math.nan
    main_s = (main.user_time + main.system_time) if main else math.nan
    return times.user + times.system, main_s


def pyspy_start(
    pids: Mapping[str, int], seconds: float, out: Path, label: str
) -> list[tuple[str, subprocess.Popen[bytes], Path]]:
    exe = os.environ.get("PYSPY") or shutil.which("py-spy")
    if exe is None:
        print("py-spy not found: no profile", flush=True)
        return []
    started = []
    for role, pid in pids.items():
        path = out / f"pyspy-{label}-{role}.txt"
        command = [
            exe, "record", "--pid", str(pid), "--duration", str(int(seconds)), "--rate", "100",
            "--format", "raw", "--idle", "--threads", "--nonblocking", "--output", str(path),
        ]  # fmt: skip
        log = (out / f"pyspy-{label}-{role}.log").open("wb")
        started.append(
            (role, subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT), path)
        )
    return started


def pct(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def judged(results: Sequence[RequestResult], duration_s: float, spec: StudySpec) -> dict[str, Any]:
    figures = summarize_client(results, duration_s)
    verdict = score(figures, Criteria.of(spec))
    keep = ("requests", "ttft_p50_s", "ttft_p95_s", "ttft_p99_s", "tpot_p50_s", "tpot_p95_s",
            "e2e_p99_s", "send_lag_p99_s")  # fmt: skip
    out: dict[str, Any] = {k: figures[k] for k in keep if k in figures}
    out["passed"] = verdict.feasible
    out["violations"] = verdict.violations
    return out


def timeline(results: Sequence[RequestResult]) -> list[dict[str, Any]]:
    """Per second of scheduled sends: requests, TTFT p50/p95/max, send lag max."""
    seconds: dict[int, list[RequestResult]] = {}
    for r in results:
        seconds.setdefault(int(r.scheduled_s), []).append(r)
    rows = []
    for second in sorted(seconds):
        rs = seconds[second]
        ttfts = [r.ttft_s for r in rs if r.ttft_s is not None]
        rows.append({
            "s": second, "n": len(rs), "ttft_p50_s": pct(ttfts, 50), "ttft_p95_s": pct(ttfts, 95),
            "ttft_max_s": max(ttfts, default=None),
            "send_lag_max_s": max(r.sent_s - r.scheduled_s for r in rs),
        })  # fmt: skip
    return rows


def gauges_during(texts: Sequence[str]) -> list[tuple[float | None, float | None]]:
    rows = []
    for text in texts:
        values = parse_scrape(text).values
        rows.append(
            (values.get("vllm:num_requests_running"), values.get("vllm:num_requests_waiting"))
        )
    return rows


def steps_of(before: str, after: str) -> dict[str, float | None]:
    """vLLM's engine steps over the window and the tokens each carried."""
    b, a = parse_scrape(before).histograms, parse_scrape(after).histograms
    if ITERATION_TOKENS not in a:
        return {}
    delta = (
        a[ITERATION_TOKENS].minus(b[ITERATION_TOKENS])
        if ITERATION_TOKENS in b
        else a[ITERATION_TOKENS]
    )
    return {
        "steps": delta.count, "tokens_per_step_mean": delta.mean,
        "tokens_per_step_p50": delta.quantile(0.5), "tokens_per_step_p95": delta.quantile(0.95),
    }  # fmt: skip


def run_window(
    engine: Engine, setup: TrialSetup, spec: StudySpec, window: Window, index: int,
    procs: dict[str, list[int]], out: Path,
) -> dict[str, Any]:  # fmt: skip
    requests, full_from_s = window_requests(setup, window)
    idle = wait_idle(engine.base_url, timeout_s=60.0)
    reset = reset_prefix_cache(engine.base_url)
    settings = dataclasses.replace(setup.replay, seed=setup.replay.seed + SEED_STRIDE * (index + 1))
    watched = serving_processes(procs)
    log_at = engine.mark()
    spies = pyspy_start(watched, window.pyspy_s, out, window.label) if window.pyspy_s else []
    cpu_before = {role: cpu_seconds(pid) for role, pid in watched.items()}
    began = time.monotonic()
    result = replay(engine.base_url, requests, settings)
    wall_s = time.monotonic() - began
    cpu_after = {role: cpu_seconds(pid) for role, pid in watched.items()}
    for role, spy, path in spies:
        try:
            spy.wait(timeout=window.pyspy_s + 60)
        except subprocess.TimeoutExpired:
            spy.kill()
        print(
            f"py-spy {role}: rc {spy.returncode}, "
            f"{path.stat().st_size if path.exists() else 0} bytes",
            flush=True,
        )
    log = engine.handle.log_since(log_at).encode() if engine.handle is not None else b""
    results = result.results
    end_s = full_from_s + window.seconds
    record: dict[str, Any] = {
        "label": window.label, "rate_req_per_s": window.rate, "seconds": window.seconds,
        "ramped": window.ramped, "full_rate_from_s": full_from_s, "requests": len(results),
        "started_idle": idle, "prefix_cache_reset": reset, "wall_s": wall_s,
        "cpu_cores": {
            role: {
                "process": (cpu_after[role][0] - cpu_before[role][0]) / wall_s,
                "main_thread": (cpu_after[role][1] - cpu_before[role][1]) / wall_s,
            }
            for role in watched
        },
        "figures": replay_figures(result),
        "steps": steps_of(result.metrics_before, result.metrics_after),
        "gauges": gauges_during(result.metrics_during),
        "late_jit": [m.decode(errors="replace") for m in LATE_JIT.findall(log)],
        "timeline": timeline(results),
        "pyspy": {role: str(path.name) for role, _, path in spies},
    }  # fmt: skip
    parts: dict[str, Any] = {"whole": judged(results, result.duration_s, spec)}
    if window.ramped:
        steady = [r for r in results if r.scheduled_s >= full_from_s]
        parts["steady"] = judged(steady, result.duration_s, spec)
    else:
        for name, (lo, hi) in PARTS.items():
            if hi <= end_s:
                part = [r for r in results if lo <= r.scheduled_s < hi]
                parts[name] = judged(part, result.duration_s, spec)
    record["parts"] = parts
    columns = {
        "scheduled_s": [r.scheduled_s for r in results], "sent_s": [r.sent_s for r in results],
        "ttft_s": [r.ttft_s for r in results], "e2e_s": [r.e2e_s for r in results],
        "input_tokens": [r.input_tokens for r in results],
        "output_tokens": [r.output_tokens for r in results],
        "error": [r.error for r in results],
    }  # fmt: skip
    (out / f"requests-{window.label}.json").write_text(json.dumps(columns))
    return record


def show(record: Mapping[str, Any]) -> str:
    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value * 1000:.0f}"

    parts = record["parts"]
    cells = []
    for name, part in parts.items():
        mark = "ok" if part["passed"] else "FAIL"
        cells.append(
            f"{name} ttft95 {ms(part.get('ttft_p95_s'))} tpot95 {ms(part.get('tpot_p95_s'))} {mark}"
        )
    f = record["figures"]
    cpu = record["cpu_cores"]
    cpu_text = " ".join(
        f"{role} {c['process']:.2f}/{c['main_thread']:.2f}" for role, c in cpu.items()
    )
    waiting = [w for _, w in record["gauges"] if w is not None]
    steps = record["steps"]
    return (
        f"{record['label']:>15} {record['rate_req_per_s']:>5.0f} req/s n={record['requests']:>5} | "
        + " | ".join(cells)
        + f" | vLLM ttft95 {ms(f.get('server_ttft_p95_s'))}"
        f" queue95 {ms(f.get('server_queue_p95_s'))}"
        f" prefill95 {ms(f.get('server_prefill_p95_s'))} | cores (process/main) {cpu_text}"
        f" | waiting max {max(waiting, default=0):.0f}"
        f" | steps {steps.get('steps', 0):.0f}"
        f" tok/step {steps.get('tokens_per_step_mean') or 0:.0f}"
        f" | late JIT {len(record['late_jit'])}"
    )


def cmd_probe(args: argparse.Namespace) -> int:
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    launcher = ServeLauncher(out / "launcher.log")
    spec, setup = build(args.spec, args.trace, launcher)
    plan = PLANS["cpu" if args.cpu_plan else args.plan]
    engine_args = {**spec.engine_args, **dict(args.engine_arg)}
    engine = Engine(spec.model, engine_args, out / "engine", launcher=launcher, env=setup.env)
    try:
        engine.start()
        healthy_s = engine.wait_healthy(spec.health_timeout_s)
        assert launcher.last is not None
        procs = server_processes(launcher.last.pid)
        meta = {
            "healthy_s": healthy_s,
            "processes": procs,
            "startup": engine.times.startup,
            "measured_on": measured_on(),
            "engine_args": engine_args,
            "plan": "cpu" if args.cpu_plan else args.plan,
        }
        (out / "meta.json").write_text(json.dumps(meta, indent=1))
        print(f"vLLM healthy after {healthy_s:.0f} s; processes {procs}", flush=True)
        replay(engine.base_url, setup.warmup_requests, setup.replay)
        with (out / "windows.jsonl").open("a") as log:
            for index, window in enumerate(plan):
                record = run_window(engine, setup, spec, window, index, procs, out)
                log.write(json.dumps(record) + "\n")
                log.flush()
                print(show(record), flush=True)
    finally:
        engine.stop()
        launcher.close()
    return 0


def engine_arg(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r}: use KEY=VALUE")
    return key, yaml.safe_load(value)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    probe = sub.add_parser("probe", help="one server: windows from idle, ramped in, under py-spy")
    probe.add_argument("--spec", type=Path, required=True)
    probe.add_argument("--trace", type=Path, required=True)
    probe.add_argument("--out", type=Path, required=True)
    probe.add_argument("--plan", choices=sorted(PLANS), default="story", help="the windows")
    probe.add_argument("--cpu-plan", action="store_true", help="the same as --plan cpu")
    probe.add_argument(
        "--engine-arg", action="append", type=engine_arg, default=[], metavar="KEY=VALUE",
        help="an engine argument over the spec's engine_args (YAML value); repeatable",
    )  # fmt: skip
    args = parser.parse_args(argv)
    return cmd_probe(args)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
