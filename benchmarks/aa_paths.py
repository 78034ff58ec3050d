"""A/A by path: how often each path that can write a searched configuration with exit 0 does so
where nothing is better, and what the interval of a written verdict covers.

``benchmarks/aa.py`` measures the main path (a search, one confirmation, the choice). The paths
here are the others a run can take, each a real ``Run`` over an in-memory Optuna study with
``aa.py``'s seeded stand-in engines (``NoisyEngines``: the GPU spread of capacity per engine;
``NoisyScores``: a latency study whose baseline misses the SLOs on a share of its engines):

- ``miss, unconfirmed``: the baseline misses the SLOs on a share of its engines and no fresh
  measurement follows the search (``confirm_repeats: 0``, as where the time budget holds none);
- ``failed engines``: every engine fails to start with probability ``FAIL_SHARE`` (the baseline
  at trial 0, a searched one, a fresh one); with ``miss``, on the latency path above, so that
  the finalist's own first fresh engine fails where the baseline missed the SLOs;
- ``resumed``: one study continued ``RESUMES`` times (a run of 3 searched configurations, then
  runs of 2 more, each with its confirmation): a study counts as written where any of its runs
  wrote a searched configuration, as a user who serves what a run wrote would;
- ``--current``: your configuration as the baseline and vLLM's defaults a candidate re-measured
  after the round (``tuner init --current``), every configuration but yours ``gain`` times
  better (``AllBetter``); also how often a round whose fresh pairs all
  favoured its finalist ends with the verdict that a finalist "was not measured on fresh
  engines" (``lost``: the candidates' re-measurements ranked another first), at each gain of
  vLLM's defaults over your configuration;
- ``interval``: of the verdicts written on the main path (GPU spread, 3 searched), where the
  first searched configuration is ``gain`` times better, how many print an interval whose lower
  end is below 1.0x, and how many intervals hold the true ratio (``gain`` where the better one
  was written, 1 where another was).

A study is written where its choice is ``TUNED`` (``tuner run`` exits 0 with a searched
configuration); the other searched configurations written (exit 3, unconfirmed) are counted
apart. Seeded: the same shares each run.

    python benchmarks/aa_paths.py                      # 400 studies a row
    python benchmarks/aa_paths.py --studies 100        # a quick look
    python benchmarks/aa_paths.py --output benchmarks/results/aa/paths.txt
"""

from __future__ import annotations

import argparse
import logging
import random
import re
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import aa
import optuna
from scipy.stats import binomtest

from tuner.engine import EngineFailed, ProcessLauncher, write_model
from tuner.study import (
    CAPACITY_OBJECTIVE,
    LATENCY_OBJECTIVE,
    TUNED,
    Run,
    StudyObjective,
    StudySpec,
    TrialOutcome,
    TrialSetup,
    Workload,
    choose,
    open_study,
    resolve,
)

# The share of engine starts that fail (an engine start is a trial's, or a fresh measurement's).
FAIL_SHARE = 0.1
# The continuations of a resumed study (runs after its first), and those its rows report after.
RESUMES = 12
RESUMES_SHOWN = (1, 4, 12)
# Searched configurations in a resumed study's first run, and in each continuation.
FIRST_SEARCHED, MORE_SEARCHED = 3, 2
# ``1.61x, 90% interval 1.27 to 1.94x`` (or ``from 1.27x`` where too few bound it above).
INTERVAL = re.compile(r"(\d+\.\d+)x, \d+% interval (?:from )?(\d+\.\d+)(?:x| to (\d+\.\d+)x)")

Engines = aa.NoisyEngines | aa.NoisyScores


@dataclass
class Failing:
    """A trial runner that fails to start an engine with probability ``share``, as vLLM's does
    when it exits during start-up; otherwise ``inner`` measures."""

    inner: Engines
    rng: random.Random
    share: float = FAIL_SHARE

    @property
    def better(self) -> dict[str, Any] | None:
        return self.inner.better

    def __call__(
        self, args: Mapping[str, Any], setup: TrialSetup, workdir: Path, should_stop: Any = None
    ) -> TrialOutcome:
        if self.rng.random() < self.share:
            # The configuration is still the one it is: the stand-in learns which one first.
            if isinstance(self.inner, aa.NoisyEngines):
                self.inner.capacity_of(args)
            else:
                self.inner.ttft_of(args)
            # As the trial's measure reports a server that exited during its start.
            return setup.measure.failed(args, EngineFailed("vLLM exited with status 1", ""))
        return self.inner(args, setup, workdir, should_stop)


@dataclass
class AllBetter(aa.NoisyEngines):
    """``NoisyEngines`` where every configuration but the baseline (your configuration, in a
    ``--current`` study) carries ``gain`` times its capacity: vLLM's defaults and what the
    search finds near them alike."""

    def capacity_of(self, args: Mapping[str, Any]) -> float:
        args = dict(args)
        if self.baseline is None:
            self.baseline = args
        elif self.better is None and args != self.baseline:
            self.better = args
        return aa.CAPACITY_REQ_PER_S * (1.0 if args == self.baseline else self.gain)


@dataclass
class Outcome:
    """What one study came to: written with exit 0 (``tuned``), the better configuration so
    (``better``), a searched configuration written unconfirmed (``unconfirmed``, exit 3), a
    round whose fresh pairs all favoured its finalist, said afterwards to lack fresh
    measurements (``lost``), and the verdict's words."""

    tuned: bool = False
    better: bool = False
    unconfirmed: bool = False
    lost: bool = False
    why: str = ""
    # Confirmation rounds the study holds (finalists with fresh measurements).
    rounds: int = 0


def one_run(
    study: optuna.Study,
    spec: StudySpec,
    workload: Workload,
    runner: Any,
    work: Path,
    searched: int,
) -> Outcome:
    """One ``tuner run`` over ``study``: ``searched`` more trials (the baseline first in a new
    study), the confirmation, and the choice."""
    config = resolve(
        spec, study.study_name, work / "runs", work / "configs" / "aa.yaml",
        n_trials=searched + (0 if study.trials else 1),
    )  # fmt: skip
    run = Run(study, spec, workload, config, launcher=ProcessLauncher(), runner=runner)
    run.calibrate()
    run.add_trials()
    run.confirm()
    choice = choose(study)
    if choice is None:
        return Outcome()
    engines = runner.inner if isinstance(runner, Failing) else runner
    written = dict(choice.group.first.user_attrs.get("engine_args") or {})
    searched_one = written != engines.baseline
    tuned = choice.outcome == TUNED
    return Outcome(
        tuned=tuned,
        better=tuned and (written == engines.better or isinstance(engines, AllBetter)),
        unconfirmed=not tuned and searched_one and choice.meets_slos,
        lost=_confirmed_round(study) and "not measured on fresh engines" in choice.why,
        why=choice.why,
        rounds=len(
            {t.user_attrs["fresh_for"] for t in study.trials if "fresh_for" in t.user_attrs}
        ),
    )


def _confirmed_round(study: optuna.Study) -> bool:
    """Whether some finalist's fresh measurements, three or more of each, all beat the
    baseline's (a round that confirmed, read from the trials themselves)."""
    fresh: dict[int, dict[bool, list[float]]] = {}
    for trial in study.get_trials(deepcopy=False):
        of = trial.user_attrs.get("fresh_for")
        if of is None or trial.value is None or not trial.user_attrs.get("feasible"):
            continue
        mine = trial.user_attrs.get("confirms") == of
        value = float(trial.value)
        fresh.setdefault(of, {True: [], False: []})[mine].append(value)
    for sides in fresh.values():
        mine, theirs = sides[True], sides[False]
        if len(mine) >= 3 and len(theirs) >= 3 and len(mine) == len(theirs):
            if study.direction == optuna.study.StudyDirection.MAXIMIZE:
                won = min(mine) > max(theirs)
            else:
                won = max(mine) < min(theirs)
            if won:
                return True
    return False


@dataclass(frozen=True)
class PathRow:
    """A path's row: ``studies`` studies, ``written`` with exit 0, ``right`` the better one,
    ``unconfirmed`` written with exit 3, ``lost`` swept and then said unmeasured."""

    path: str
    gain: float
    studies: int
    written: int
    right: int = 0
    unconfirmed: int = 0
    lost: int = 0
    # The most confirmation rounds one study held.
    rounds: int = 0

    @property
    def share(self) -> float:
        return self.written / self.studies

    def interval(self) -> tuple[float, float]:
        ci = binomtest(self.written, self.studies).proportion_ci(0.95, method="exact")
        return float(ci.low), float(ci.high)

    def line(self) -> str:
        low, high = self.interval()
        return (
            f"{self.path:32} {self.gain:5.2f} {self.studies:7} {self.written:7} {self.share:6.1%} "
            f"{low:6.1%}-{high:6.1%} {self.right:6} {self.unconfirmed:6} {self.lost:5} "
            f"{self.rounds:6}"
        )


HEADER = (
    f"{'path':32} {'gain':>5} {'studies':>7} {'written':>7} {'share':>6} {'95% interval':>13} "
    f"{'better':>6} {'exit3':>6} {'lost':>5} {'rounds':>6}"
)


@dataclass
class Bench:
    """What every path's studies share: the folder, the seed, and the stand-in model's specs."""

    work: Path
    seed: int

    def __post_init__(self) -> None:
        self.model = write_model(self.work / "model", "cpu-demo", weights=False)

    def capacity_spec(self, searched: int, **changes: Any) -> StudySpec:
        return replace(aa.spec_for(self.model, searched), **changes)

    def latency_spec(self, searched: int, **changes: Any) -> StudySpec:
        return replace(aa.latency_spec_for(self.model, searched), **changes)

    def study(self, key: str, n: int, objective: StudyObjective) -> optuna.Study:
        seed = self.seed * 100_003 + n
        name = f"aa-{key}-{n}"
        return open_study(name, optuna.storages.InMemoryStorage(), seed, objective=objective)

    def rng(self, key: str, n: int) -> random.Random:
        return random.Random(f"{self.seed}-{key}-{n}")


def count(path: str, gain: float, outcomes: Sequence[Outcome]) -> PathRow:
    return PathRow(
        path, gain, len(outcomes), sum(o.tuned for o in outcomes),
        sum(o.better for o in outcomes), sum(o.unconfirmed for o in outcomes),
        sum(o.lost for o in outcomes), max((o.rounds for o in outcomes), default=0),
    )  # fmt: skip


def miss_unconfirmed(bench: Bench, miss: float, studies: int) -> PathRow:
    """The baseline misses the SLOs on ``miss`` of its engines; no fresh measurement."""
    spec = bench.latency_spec(3, confirm_repeats=0)
    workload = aa.workload_for(spec, bench.work)
    key = f"unconfirmed-{miss}"
    outcomes = []
    for n in range(studies):
        engines = aa.NoisyScores(bench.rng(key, n), miss)
        study = bench.study(key, n, LATENCY_OBJECTIVE)
        outcomes.append(one_run(study, spec, workload, engines, bench.work, 3))
    return count(f"miss {miss:.0%}, unconfirmed", 1.0, outcomes)


def failed_engines(bench: Bench, studies: int, miss: float | None = None) -> PathRow:
    """Every engine fails to start with probability ``FAIL_SHARE``: capacity studies at the
    GPU spread, or (``miss``) latency studies whose baseline misses the SLOs that often."""
    key = f"failing-{miss}"
    objective: StudyObjective
    if miss is None:
        spec, objective = bench.capacity_spec(3), CAPACITY_OBJECTIVE
    else:
        spec, objective = bench.latency_spec(3), LATENCY_OBJECTIVE
    workload = aa.workload_for(spec, bench.work)
    outcomes = []
    for n in range(studies):
        rng = bench.rng(key, n)
        inner: Engines = (
            aa.NoisyEngines(rng, *aa.SPREADS["gpu"]) if miss is None else aa.NoisyScores(rng, miss)
        )
        runner = Failing(inner, random.Random(f"{bench.seed}-{key}-fail-{n}"))
        study = bench.study(key, n, objective)
        outcomes.append(one_run(study, spec, workload, runner, bench.work, 3))
    label = "failed engines" if miss is None else f"failed engines, miss {miss:.0%}"
    return count(f"{label} ({FAIL_SHARE:.0%})", 1.0, outcomes)


def resumed(bench: Bench, studies: int, resumes: int = RESUMES) -> list[PathRow]:
    """Capacity studies at the GPU spread continued ``resumes`` times; a row after each of
    ``RESUMES_SHOWN`` continuations (and the last), counting a study written where any run so
    far wrote."""
    first, more = bench.capacity_spec(FIRST_SEARCHED), bench.capacity_spec(MORE_SEARCHED)
    workload = aa.workload_for(first, bench.work)
    shown = sorted({k for k in RESUMES_SHOWN if k <= resumes} | {resumes})
    ever: dict[int, list[Outcome]] = {k: [] for k in shown}
    for n in range(studies):
        engines = aa.NoisyEngines(bench.rng("resumed", n), *aa.SPREADS["gpu"])
        study = bench.study("resumed", n, CAPACITY_OBJECTIVE)
        so_far = one_run(study, first, workload, engines, bench.work, FIRST_SEARCHED)
        for k in range(1, resumes + 1):
            now = one_run(study, more, workload, engines, bench.work, MORE_SEARCHED)
            so_far = Outcome(so_far.tuned or now.tuned, rounds=now.rounds)
            if k in ever:
                ever[k].append(so_far)
    return [count(f"resumed {k} times", 1.0, ever[k]) for k in shown]


def current(bench: Bench, gain: float, studies: int) -> PathRow:
    """Your configuration as the baseline, vLLM's defaults a candidate re-measured after the
    round (``tuner init --current``), it and every searched configuration ``gain`` times
    better than yours, at the GPU spread."""
    spec = bench.capacity_spec(3, candidates=({},), confirm_candidates=True, defaults_candidate=0)
    workload = aa.workload_for(spec, bench.work)
    key = f"current-{gain}"
    outcomes = []
    for n in range(studies):
        engines = AllBetter(bench.rng(key, n), *aa.SPREADS["gpu"], gain=gain)
        study = bench.study(key, n, CAPACITY_OBJECTIVE)
        outcomes.append(one_run(study, spec, workload, engines, bench.work, 3))
    return count("--current", gain, outcomes)


def intervals(bench: Bench, gain: float, studies: int) -> str:
    """Of the verdicts written on the main path at ``gain``: how many print a lower end below
    1.0x, and how many intervals hold the true ratio (``gain`` where the better configuration
    was written, 1.0 where another was)."""
    spec = bench.capacity_spec(3)
    workload = aa.workload_for(spec, bench.work)
    key = f"interval-{gain}"
    below = 0
    held = {True: [0, 0], False: [0, 0]}  # better written or not: [written, interval holds]
    for n in range(studies):
        engines = aa.NoisyEngines(bench.rng(key, n), *aa.SPREADS["gpu"], gain=gain)
        study = bench.study(key, n, CAPACITY_OBJECTIVE)
        outcome = one_run(study, spec, workload, engines, bench.work, 3)
        found = INTERVAL.search(outcome.why) if outcome.tuned else None
        if found is None:
            continue
        low = float(found.group(2))
        high = float(found.group(3)) if found.group(3) else float("inf")
        truth = gain if outcome.better else 1.0
        below += low < 1.0
        held[outcome.better][0] += 1
        held[outcome.better][1] += low <= truth <= high
    (right, right_held), (wrong, wrong_held) = held[True], held[False]
    return (
        f"interval, gain {gain:.2f}: {studies} studies, {right + wrong} written; lower end below "
        f"1.0x in {below} ({_share(below, right + wrong)}); holds {gain:.2f}x in {right_held} "
        f"of {right} that wrote the better one ({_share(right_held, right)}), 1.0x in "
        f"{wrong_held} of {wrong} that wrote another"
    )


def _share(part: int, whole: int) -> str:
    return f"{part / whole:.0%}" if whole else "n/a"


def measured(options: argparse.Namespace, work: Path, say: Callable[[str], None]) -> None:
    """Every path's rows, each said as it is measured."""
    bench = Bench(work, options.seed)
    studies = options.studies
    say(HEADER)
    for miss in (0.25, 0.5):
        say(miss_unconfirmed(bench, miss, studies).line())
    say(failed_engines(bench, studies).line())
    say(failed_engines(bench, studies, miss=0.5).line())
    for row in resumed(bench, options.resumed_studies):
        say(row.line())
    for gain in (1.0, 1.2, 1.5):
        say(current(bench, gain, studies if gain == 1.0 else options.power_studies).line())
    for gain in (1.2, 1.5):
        say(intervals(bench, gain, options.power_studies))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--studies", type=int, default=400, help="null studies a row")
    parser.add_argument("--resumed-studies", type=int, default=200, help="resumed studies")
    parser.add_argument("--power-studies", type=int, default=200, help="studies at a gain")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", type=Path, help="write what is printed here too")
    options = parser.parse_args(argv)
    logging.disable(logging.INFO)
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    lines: list[str] = [f"$ python benchmarks/aa_paths.py {' '.join(sys.argv[1:])}".rstrip()]
    print(lines[0])

    def say(line: str) -> None:
        lines.append(line)
        print(line, flush=True)

    began = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        measured(options, Path(tmp), say)
    say(f"{time.monotonic() - began:.0f} s")
    if options.output is not None:
        options.output.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
