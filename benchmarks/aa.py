"""A/A: how often the whole pipeline writes a winner where nothing is better, and how often it
finds a real gain.

Each study is a real ``Run`` (``tuner.study.result.run``: the search from vLLM's defaults, the
finalist, the confirmation on fresh engines in ABBA order, the choice) over an in-memory Optuna
study, with its engines replaced by a seeded stand-in (``NoisyEngines``) that runs tuner's own
capacity search (``tuner.study.capacity.rates.search_capacity``, the rate ladder, the gate, the
one window at the finalist's capacity) against a server whose capacity is drawn per engine:

- ``gpu``: the spread of one configuration on fresh GPU engines in benchmarks/results' studies,
  a pooled SD of 0.086 in log capacity, and one engine in six reading 30 to 40 % low;
- ``cpu``: the CPU Quick start's, an SD of 0.236 (a shared 2-core machine), no outliers;

and each rate's window passes where the rate is below that capacity, times a window's own noise
(SD 0.03). In an A/A study every configuration has the same capacity; for the power, the first
searched configuration (as max-num-batched-tokens 2048 was on the long-prompt traces) carries
``gain`` times more and the others as much as the defaults.

The Quick start's case is a latency study whose baseline (your configuration) misses the SLOs on
some of its engines, where the verdict goes by feasibility first (``NoisyScores``): each engine's
TTFT p95 is drawn around the configuration's own with the CPU spread (log SD 0.236), placed so
that the baseline's engines miss the TTFT SLO with probability ``miss`` (0.25, 0.5, 0.75); in an
A/A study every configuration is the baseline's equal, for the power the first searched one's
TTFT is ``gain`` times lower.

    python benchmarks/aa.py                      # 400 null studies a row, 200 for each gain
    python benchmarks/aa.py --studies 100 --gains ""    # a quick look: null studies only
    python benchmarks/aa.py --misses ""                 # capacity studies only
    python benchmarks/aa.py --result aa                 # and write benchmarks/results/aa/

It prints, for each spread and number of searched configurations, the share of null studies
that wrote a searched configuration (with its 95 % Clopper-Pearson interval, scipy's), then the
share of studies that wrote the better configuration at each gain, and how many measurements the
confirmation took. tests/test_aa.py holds the null share at most 5 %.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from statistics import NormalDist
from typing import Any

import harness
import optuna
from scipy.stats import binomtest

from tuner.engine import ProcessLauncher, write_model
from tuner.study import (
    CAPACITY_OBJECTIVE,
    LATENCY_OBJECTIVE,
    TUNED,
    CapacityFound,
    Ended,
    RatePoint,
    RateSearch,
    Run,
    StudyObjective,
    StudySpec,
    TrialOutcome,
    TrialRecord,
    TrialSetup,
    Workload,
    choose,
    model_of,
    open_loop_replay,
    open_study,
    parse_spec,
    resolve,
    score,
    search_capacity,
)
from tuner.traces import load_trace

SPREADS: dict[str, tuple[float, float]] = {
    # (SD of log capacity per engine, share of engines reading 30 to 40 % low)
    "gpu": (0.086, 1 / 6),
    "cpu": (0.236, 0.0),
}
WINDOW_SD = 0.03
CAPACITY_REQ_PER_S = 10.0


@dataclass
class NoisyEngines:
    """A trial runner: each call a fresh engine whose capacity is drawn around the
    configuration's own, searched with tuner's capacity search."""

    rng: random.Random
    sd: float
    low_share: float
    gain: float = 1.0
    better: dict[str, Any] | None = None
    baseline: dict[str, Any] | None = None
    calls: list[str] = field(default_factory=list)

    def capacity_of(self, args: Mapping[str, Any]) -> float:
        args = dict(args)
        if self.baseline is None:
            self.baseline = args  # trial 0: vLLM's defaults
        elif self.better is None and args != self.baseline:
            self.better = args  # the first searched configuration
        good = self.better is not None and args == self.better
        return CAPACITY_REQ_PER_S * (self.gain if good else 1.0)

    def engine(self, args: Mapping[str, Any]) -> float:
        drawn = self.capacity_of(args) * math.exp(self.rng.gauss(0.0, self.sd))
        if self.rng.random() < self.low_share:
            drawn *= self.rng.uniform(0.6, 0.7)
        return drawn

    def __call__(
        self, args: Mapping[str, Any], setup: TrialSetup, workdir: Path, should_stop: Any = None
    ) -> TrialOutcome:
        search = setup.measure
        assert isinstance(search, RateSearch)
        settings = search.settings
        engine = self.engine(args)
        self.calls.append("baseline" if dict(args) == self.baseline else "other")

        def measure(rate: float) -> RatePoint:
            passed = rate <= engine * math.exp(self.rng.gauss(0.0, WINDOW_SD))
            return RatePoint(rate, passed, {"ttft_p95_s": 0.1 if passed else 9.0})

        found = search_capacity(
            measure, settings.start_req_per_s, settings.resolution, settings.max_probes,
            settings.floor_req_per_s, first_step=settings.first_step,
            gate_req_per_s=settings.gate_req_per_s,
        )  # fmt: skip
        found = _compared(found, settings.compare_req_per_s, measure)
        ended = Ended(timings={}, crashed=False, log_tail="", compiled={}, late={})
        return search.outcome(args, setup, found, ended)


TTFT_SLO_S = 2.0
CPU_SD = SPREADS["cpu"][0]
TIMINGS = {"engine_healthy_s": 30.0, "window_s": 10.0, "engine_stop_s": 1.0, "trial_s": 45.0}


@dataclass
class NoisyScores:
    """A latency study's trial runner: each call a fresh engine whose TTFT p95 is drawn around
    the configuration's own (log SD ``sd``), the baseline's placed so that its engines miss the
    TTFT SLO with probability ``miss``; the first searched configuration's is ``gain`` times
    lower (1: every configuration the baseline's equal). Every engine fails ``error_rate`` of
    its requests."""

    rng: random.Random
    miss: float
    sd: float = CPU_SD
    gain: float = 1.0
    error_rate: float = 0.0
    better: dict[str, Any] | None = None
    baseline: dict[str, Any] | None = None

    def ttft_of(self, args: Mapping[str, Any]) -> float:
        """The configuration's median TTFT p95 over engines."""
        args = dict(args)
        if self.baseline is None:
            self.baseline = args  # trial 0: the spec's baseline
        elif self.better is None and args != self.baseline:
            self.better = args
        median = TTFT_SLO_S * math.exp(self.sd * NormalDist().inv_cdf(self.miss))
        good = self.better is not None and args == self.better
        return median / self.gain if good else median

    def __call__(
        self, args: Mapping[str, Any], setup: TrialSetup, workdir: Path, should_stop: Any = None
    ) -> TrialOutcome:
        ttft = self.ttft_of(args) * math.exp(self.rng.gauss(0.0, self.sd))
        metrics = {"ttft_p95_s": ttft, "tpot_p95_s": 0.01, "e2e_p99_s": ttft + 2.0,
                   "error_rate": self.error_rate, "throughput_req_per_s": 5.0}  # fmt: skip
        outcome = score(metrics, setup.criteria)
        reason = None if outcome.feasible else f"SLO missed: ttft_p95_s {ttft * 1000:.0f} ms"
        return TrialOutcome(args, outcome, metrics, TIMINGS, reason)


def latency_spec_for(model: Path, searched: int) -> StudySpec:
    """The Quick start's shape: a latency study from a baseline of your own (2 sequences, 512
    tokens a step) over ``searched`` configurations, the confirmation as tuner writes it."""
    return parse_spec(
        {
            "model": str(model),
            "dummy_model": None,
            "engine_args": {"load-format": "dummy"},
            "search_space": {
                "max-num-seqs": {"type": "int", "low": 1, "high": 32, "log": True},
                "max-num-batched-tokens": {"type": "int", "low": 512, "high": 16384, "log": True},
            },
            "baseline": {"max-num-seqs": 2, "max-num-batched-tokens": 512},
            "slos": {"ttft_p95_s": TTFT_SLO_S, "e2e_p99_s": 30.0},
            "weights": {"ttft_p95_s": 1.0},
            "window_s": 10,
            "n_trials": 1 + searched,
        }
    )


def _compared(found: CapacityFound, rate: float | None, measure: Any) -> CapacityFound:
    if rate is None or rate <= found.capacity_req_per_s or not found.points:
        return found
    return dataclasses.replace(found, compared=measure(rate))


def spec_for(model: Path, searched: int) -> StudySpec:
    """A capacity study of ``searched`` configurations besides vLLM's defaults, the spec's
    confirmation as tuner writes it."""
    return parse_spec(
        {
            "model": str(model),
            "dummy_model": None,
            "engine_args": {"load-format": "dummy"},
            "search_space": {
                "max-num-seqs": {"type": "int", "low": 16, "high": 1024, "log": True},
                "max-num-batched-tokens": {
                    "type": "categorical",
                    "choices": [2048, 4096, 8192, 16384],
                },
            },
            "baseline": {"max-num-seqs": 1024, "max-num-batched-tokens": 8192},
            "slos": {"ttft_p95_s": 1.0},
            "weights": {"ttft_p95_s": 1.0},
            "window_s": 10,
            "objective_mode": "capacity",
            "n_trials": 1 + searched,
            "search": "tpe",
        }
    )


def one_study(
    spec: StudySpec,
    workload: Workload,
    engines: NoisyEngines | NoisyScores,
    work: Path,
    seed: int,
    objective: StudyObjective = CAPACITY_OBJECTIVE,
) -> tuple[bool, bool, int, int]:
    """One study run through: whether it wrote a searched configuration, whether that was the
    better one, how many fresh measurements the confirmation took, and how many windows the
    search's trials after the first measured (a searched trial's cost beside its engine's
    start: one where it was screened out at its gate)."""
    study = open_study(f"aa-{seed}", optuna.storages.InMemoryStorage(), seed, objective=objective)
    config = resolve(spec, study.study_name, work / "runs", work / "configs" / "aa.yaml")
    run = Run(study, spec, workload, config, launcher=ProcessLauncher(), runner=engines)
    run.calibrate()
    searched = run.add_trials()
    confirming = run.confirm()
    del searched
    choice = choose(study)
    tuned = choice is not None and choice.outcome == TUNED
    first = choice.group.first.params if tuned and choice is not None else None
    better = engines.better is not None and first is not None and _same(first, engines, study)
    windows = sum(
        TrialRecord.of(t).rates_measured
        for t in study.trials
        if t.number > 0 and TrialRecord.of(t).confirms is None
    )
    return tuned, better, confirming, windows


def _same(
    params: Mapping[str, Any], engines: NoisyEngines | NoisyScores, study: optuna.Study
) -> bool:
    chosen = next(t for t in study.trials if t.params == params)
    args = chosen.user_attrs.get("engine_args") or {}
    return dict(args) == engines.better


def workload_for(spec: StudySpec, work: Path) -> Workload:
    trace_path = work / "trace.csv"
    rows = "".join(
        f"{0.1 * i:.1f},{200 + (i * 37) % 300},{50 + (i * 11) % 100}\n" for i in range(100)
    )
    trace_path.write_text("timestamp,input_tokens,output_tokens\n" + rows)
    trace = load_trace(trace_path)
    model = model_of(spec)
    replay = open_loop_replay(trace, spec.window_s, 1.0, model.max_model_len)
    return Workload(trace_path, "0" * 64, trace, replay, spec.window_s, 1.0, model)


@dataclass(frozen=True)
class Row:
    spread: str
    searched: int
    gain: float
    studies: int
    written: int
    right: int
    fresh_median: float
    # The windows the search's trials after the first measured, a study on average.
    search_windows: float = 0.0

    @property
    def share(self) -> float:
        return self.written / self.studies

    def interval(self) -> tuple[float, float]:
        ci = binomtest(self.written, self.studies).proportion_ci(0.95, method="exact")
        return float(ci.low), float(ci.high)


def measure_row(
    spread: str, searched: int, gain: float, studies: int, seed: int, work: Path
) -> Row:
    """``studies`` studies of ``searched`` configurations at ``spread``, the first searched one
    ``gain`` times better."""
    model = write_model(work / "model", "cpu-demo", weights=False)
    spec = spec_for(model, searched)
    workload = workload_for(spec, work)
    sd, low = SPREADS[spread]
    written = right = 0
    fresh: list[int] = []
    windows: list[int] = []
    for n in range(studies):
        rng = random.Random(f"{seed}-{spread}-{searched}-{gain}-{n}")
        engines = NoisyEngines(rng, sd, low, gain)
        tuned, better, confirming, searched_windows = one_study(
            spec, workload, engines, work, seed * 100_003 + n
        )
        written += tuned
        right += better
        fresh.append(confirming)
        windows.append(searched_windows)
    return Row(
        spread, searched, gain, studies, written, right, statistics.median(fresh),
        statistics.fmean(windows),
    )  # fmt: skip


def measure_miss_row(
    miss: float, searched: int, gain: float, studies: int, seed: int, work: Path
) -> Row:
    """``studies`` latency studies of ``searched`` configurations whose baseline misses the SLOs
    on a share ``miss`` of its engines, the first searched one's TTFT ``gain`` times lower."""
    model = write_model(work / "model", "cpu-demo", weights=False)
    spec = latency_spec_for(model, searched)
    workload = workload_for(spec, work)
    written = right = 0
    fresh: list[int] = []
    for n in range(studies):
        rng = random.Random(f"{seed}-miss-{miss}-{searched}-{gain}-{n}")
        engines = NoisyScores(rng, miss, gain=gain)
        seeded = seed * 100_003 + n
        tuned, better, confirming, _ = one_study(
            spec, workload, engines, work, seeded, objective=LATENCY_OBJECTIVE
        )
        written += tuned
        right += better
        fresh.append(confirming)
    label = f"miss {miss:.0%}"
    return Row(label, searched, gain, studies, written, right, statistics.median(fresh))


def null_rows(
    studies: int,
    seed: int,
    spreads: Sequence[str] = tuple(SPREADS),
    searched: Sequence[int] = (3, 6, 9),
) -> list[Row]:
    """The null (A/A) rows: every configuration the same."""
    with tempfile.TemporaryDirectory() as tmp:
        return [
            measure_row(spread, k, 1.0, studies, seed, Path(tmp))
            for spread in spreads
            for k in searched
        ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--studies", type=int, default=400, help="null studies a row")
    parser.add_argument("--power-studies", type=int, default=200, help="studies a gain")
    parser.add_argument("--gains", default="1.2,1.5,2", help="comma-separated, '' for none")
    parser.add_argument("--searched", default="3,6,9")
    parser.add_argument(
        "--misses", default="0.25,0.5,0.75",
        help="latency studies whose baseline misses the SLOs on this share of engines ('' none)",
    )  # fmt: skip
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="write the rows here too")
    parser.add_argument(
        "--result",
        metavar="NAME",
        help="write the result to benchmarks/results/NAME/ (README.md, summary.json)",
    )
    options = parser.parse_args(argv)
    logging.disable(logging.INFO)
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    with harness.Printed() as printed:
        rows = _rows(options)
    data = [dataclasses.asdict(r) for r in rows]
    if options.json is not None:
        options.json.write_text(json.dumps(data, indent=1))
    if options.result:
        title = "A/A: how often a searched configuration is written where none is better"
        folder = harness.RESULTS / options.result
        harness.write_result(folder, title, harness.command_line(), printed.text(), data=data)
    return 0


def _rows(options: argparse.Namespace) -> list[Row]:
    """Every row the options ask for, each printed as it is measured."""
    searched = [int(k) for k in options.searched.split(",")]
    gains = [float(g) for g in options.gains.split(",") if g]
    began = time.monotonic()
    rows: list[Row] = []
    print(f"$ python benchmarks/aa.py {' '.join(sys.argv[1:])}".rstrip())
    print(
        "spread    searched gain studies  written  share  95% interval   better  fresh (median)"
        "  search windows (mean)"
    )
    with tempfile.TemporaryDirectory() as tmp:
        for spread in SPREADS:
            for k in searched:
                for gain in [1.0, *gains]:
                    count = options.studies if gain == 1.0 else options.power_studies
                    row = measure_row(spread, k, gain, count, options.seed, Path(tmp))
                    rows.append(row)
                    _print(row)
        for miss in [float(m) for m in options.misses.split(",") if m]:
            for k in searched:
                for gain in [1.0, *gains]:
                    count = options.studies if gain == 1.0 else options.power_studies
                    row = measure_miss_row(miss, k, gain, count, options.seed, Path(tmp))
                    rows.append(row)
                    _print(row)
    print(f"{time.monotonic() - began:.0f} s")
    return rows


def _print(row: Row) -> None:
    low, high = row.interval()
    print(
        f"{row.spread:9} {row.searched:5} {row.gain:5.2f} {row.studies:8} {row.written:8} "
        f"{row.share:6.1%} {low:6.1%}-{high:6.1%} {row.right:8} {row.fresh_median:8.1f}"
        f"{row.search_windows:13.1f}",
        flush=True,
    )


if __name__ == "__main__":
    raise SystemExit(main())
