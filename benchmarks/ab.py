"""Configurations measured against each other on fresh engines, in turns: an A/B harness.

    python benchmarks/ab.py benchmarks/arms/capture.yaml \\
        --spec benchmarks/gpu/studies/capture.yaml \\
        --trace benchmarks/gpu/traces/story-12rps.csv --repeats 3 --out out/capture-ab

The arms are a YAML (or JSON) file: ``arms``, a mapping of names to engine arguments, each put
over the spec's ``engine_args`` (``{}``: the spec's own, vLLM's defaults for the rest). Every
measurement is one of tuner's trials (``Run.measure``: a fresh engine, the spec's warm-up, its
window and SLOs, its objective: a latency study's score or a capacity study's capacity), taken
in turns, A, B, A, B, so that a slow minute of the machine falls on every arm alike, until each
arm has ``--repeats`` of them. The trials go to an Optuna study (``OUT/ab.db`` unless
``--storage``): run the same command again and it measures only what is missing (a trial cut
off is measured again). A spec with ``time_scale: auto`` is calibrated once, as ``tuner run``
calibrates it, and the calibration is kept in the study.

With ``--part W/N``, N such processes share the measurements, one a GPU (each with its own
``CUDA_VISIBLE_DEVICES``): of the turns still to take, counted over every part's study in OUT,
part W takes its share (``share``: an arm's repeats go to different parts), into
``OUT/ab-part-W.db``. Start the N parts together: each counts the others' measurements once,
at its start.

At the end, and with ``--report`` alone (no engine started), a table per arm: how many
measurements, how many met the SLOs, the median of the study's value and its spread (lowest,
highest), the median of the figures the SLOs name and of the engine's start, over every study
in OUT (``ab.db`` and the parts'); then the command that reruns it.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import re
import statistics
import sys
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import optuna
import yaml

from tuner.engine import LAUNCHERS, HostMemory, auto_launcher, host_memory, is_cpu_build
from tuner.report import FEASIBLE, INTERRUPTED, RUNNING, TrialRow, cost, row_of, rows_of
from tuner.study import (
    KV_ARGUMENTS,
    Run,
    StudySpec,
    TimeScale,
    Workload,
    load_spec,
    model_of,
    of_spec,
    of_study,
    open_loop_replay,
    open_study,
    resolve,
    runnable_baseline,
    words_of,
    write_dummy_model,
)
from tuner.traces import load_trace

# Figures of a measurement the report shows beside the study's value, where it has them.
FIGURES = ("ttft_p95_s", "tpot_p95_s", "e2e_p99_s")
# Where the time went, from vLLM's /metrics at the value (a capacity study: at its capacity), the
# second table's columns: (header, figure, scale, digits), each the median over an arm's
# measurements.
SPENT = (
    ("queue ms", "server_queue_mean_s", 1000.0, 0),
    ("prefill ms", "server_prefill_mean_s", 1000.0, 0),
    ("decode ms", "server_decode_mean_s", 1000.0, 0),
    ("ITL p95 ms", "server_itl_p95_s", 1000.0, 0),
    ("KV cache peak %", "kv_cache_usage_peak", 100.0, 1),
    ("preemptions", "server_preemptions", 1.0, 0),
    ("waiting peak", "waiting_peak", 1.0, 0),
    ("running peak", "running_peak", 1.0, 0),
)
# The SLO a rate's reason names ("missed slo_tpot_p95_s", "stopped 7 s in: ttft_p95_s lost").
SLO_IN_REASON = re.compile(r"(?:slo_)?([a-z0-9]+_p\d+_s)")


@dataclass(frozen=True)
class Arm:
    """One configuration of the A/B: its name and its engine arguments (the spec's, with the
    arm's over them), and those of them set for this machine (``sized``: the KV-cache share
    on vLLM's CPU build, which follows the memory free at the time)."""

    name: str
    engine_args: Mapping[str, Any]
    sized: tuple[str, ...] = ()

    def measured(self, engine_args: Mapping[str, Any]) -> bool:
        """Whether a trial of these engine arguments measured this arm: the same arguments,
        those set for the machine aside (a rerun may size them otherwise)."""

        def written(args: Mapping[str, Any]) -> dict[str, Any]:
            return {k: v for k, v in args.items() if k not in self.sized}

        return written(engine_args) == written(self.engine_args)


def load_arms(
    path: Path, spec: StudySpec, memory: HostMemory | None = None, reading: bool = False
) -> list[Arm]:
    """The arms of ``path`` in the file's order; a ``ValueError`` where the file has fewer than
    two, an arm is not a mapping of engine arguments, or two arms are one configuration.

    With the ``memory`` of vLLM's CPU build, an arm that does not size its KV cache gets the
    share ``tuner run`` gives its candidates there (``runnable_baseline``): vLLM's default asks
    more memory than such a machine has free. ``reading`` (a report, no engine started): the
    arms as written, each matching trials that sized what it leaves unsized, as a CPU machine's
    did, where no arm matches a trial exactly (``arm_of``)."""
    found = yaml.safe_load(path.read_text())
    arms = found.get("arms") if isinstance(found, dict) else None
    if not isinstance(arms, dict) or len(arms) < 2:
        raise ValueError(f"{path}: 'arms' must map two or more names to engine arguments")
    for name, args in arms.items():
        if not isinstance(args, dict | None):
            raise ValueError(f"{path}: arm {name!r} is not a mapping of engine arguments")
    as_candidates = replace(spec, candidates=tuple(args or {} for args in arms.values()))
    sized, _ = runnable_baseline(as_candidates, None if reading else memory)
    out: list[Arm] = []
    for name, args in zip(arms, sized.candidates, strict=True):
        added = tuple(k for k in args if k not in (arms[name] or {}))
        if reading:
            added = tuple(k for k in KV_ARGUMENTS if k not in args)
        arm = Arm(str(name), {**spec.engine_args, **args}, added)
        same = next((a.name for a in out if one_configuration(a, arm, exact=reading)), None)
        if same is not None:
            raise ValueError(f"{path}: arms {same!r} and {arm.name!r} are one configuration")
        out.append(arm)
    return out


def one_configuration(a: Arm, b: Arm, exact: bool = False) -> bool:
    """Whether the trials of one arm would be taken for the other's (``exact``: the same
    arguments)."""
    if exact:
        return dict(a.engine_args) == dict(b.engine_args)
    return a.measured(b.engine_args) or b.measured(a.engine_args)


def arm_of(row: TrialRow, arms: Sequence[Arm]) -> Arm | None:
    """The arm whose configuration the trial measured, if any: the one of the same arguments,
    else one that differs only in what it had sized for the machine."""
    exact = next((a for a in arms if dict(a.engine_args) == dict(row.engine_args)), None)
    return exact or next((a for a in arms if a.measured(row.engine_args)), None)


def measured(rows: Sequence[TrialRow], arms: Sequence[Arm]) -> dict[str, list[TrialRow]]:
    """Each arm's measurements: its trials that ran to the end (served, failed or pruned), not
    those cut off (interrupted) or still running, which are measured again."""
    out: dict[str, list[TrialRow]] = {a.name: [] for a in arms}
    for row in rows:
        arm = arm_of(row, arms)
        if arm is not None and row.outcome not in (INTERRUPTED, RUNNING):
            out[arm.name].append(row)
    return out


def rounds(arms: Sequence[Arm], repeats: int, done: Mapping[str, int]) -> list[tuple[int, Arm]]:
    """The measurements still to take, in turns, each with its round: round ``r`` measures
    every arm that has fewer than ``r + 1``, in the arms' order, until each has ``repeats``."""
    return [(r, a) for r in range(repeats) for a in arms if done.get(a.name, 0) <= r]


def share(arms: Sequence[Arm], todo: Sequence[tuple[int, Arm]], part: tuple[int, int]) -> list[Arm]:
    """Part ``w`` of ``n``'s turns: the ``k``-th arm's measurement of round ``r`` goes to part
    ``(k + r) % n``, so that an arm's repeats move from part to part (from GPU to GPU) and each
    part has about as many turns as the others."""
    index, parts = part
    return [a for r, a in todo if (arms.index(a) + r) % parts == index]


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def _cell(value: float | None, scale: float = 1.0, digits: int = 1) -> str:
    return "-" if value is None else f"{value * scale:.{digits}f}"


def report(studies: Sequence[optuna.Study], arms: Sequence[Arm]) -> list[str]:
    """A markdown table, one row per arm, of the studies' measurements of it."""
    objective = of_study(studies[0])
    rows: list[TrialRow] = []
    starts: dict[int, float] = {}  # by the row's id: trial numbers repeat across studies
    for study in studies:
        its = rows_of(study.get_trials(deepcopy=False))
        at = {bar.trial: bar.parts_s[0] for bar in cost(its)}
        starts.update((id(r), at[r.number]) for r in its if r.number in at)
        rows.extend(its)
    by_arm = measured(rows, arms)
    said = words_of(objective)
    unit = said.unit.strip() or "lower is better"
    head = [
        "arm", "n", "met SLOs", f"{said.name} median ({unit})", "lowest", "highest",
        *(f"{name[:-2]} median ms" for name in FIGURES), "engine start median s",
    ]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for name, mine in by_arm.items():
        values = [r.value for r in mine if r.value is not None]
        figures = [_median([f for r in mine if (f := r.figure(k)) is not None]) for k in FIGURES]
        started = _median([starts[id(r)] for r in mine if r.value is not None and id(r) in starts])
        cells = [
            name, str(len(mine)), str(sum(r.outcome == FEASIBLE for r in mine)),
            _cell(_median(values), digits=3), _cell(min(values, default=None), digits=3),
            _cell(max(values, default=None), digits=3),
            *(_cell(f, 1000.0) for f in figures), _cell(started),
        ]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", *spent(by_arm)]
    for arm in arms:
        unserved = Counter(r.reason for r in by_arm[arm.name] if r.value is None)
        why = "".join(f"; {n} not served: {reason}" for reason, n in unserved.items())
        lines.append(f"- {arm.name}: {dict(arm.engine_args)}{why}")
    return lines


def missed_above(row: TrialRow) -> str | None:
    """What the lowest rate above a capacity trial's capacity missed: the SLO its reason names
    (else the reason); None where no rate above it failed."""
    above = [
        p for p in row.points if not p.get("passed") and p["rate_req_per_s"] > (row.value or 0)
    ]
    if not above:
        return None
    reason = str(min(above, key=lambda p: p["rate_req_per_s"]).get("reason", ""))
    found = SLO_IN_REASON.search(reason)
    return found.group(1) if found else reason or None


def spent(by_arm: Mapping[str, Sequence[TrialRow]]) -> list[str]:
    """A markdown table, one row per arm: what the rate above its capacity missed (each
    measurement's, counted) and where the time went at its value (``SPENT``, medians)."""
    head = ["arm", "missed above capacity", *(h for h, *_ in SPENT)]
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for name, mine in by_arm.items():
        served = [r for r in mine if r.value is not None]
        missed = Counter(m for r in served if (m := missed_above(r)) is not None)
        cells = [name, ", ".join(f"{m} ({n})" for m, n in missed.most_common()) or "-"]
        for _, figure, scale, digits in SPENT:
            found = [f for r in served if (f := r.figure(figure)) is not None]
            cells.append(_cell(_median(found), scale, digits))
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def workload_of(spec: StudySpec, trace_path: Path) -> Workload:
    """The window every measurement replays, as ``tuner run`` builds it: the spec's busiest
    ``window_s`` at its time scale (1 where it is ``auto``, until the run calibrates it)."""
    write_dummy_model(spec)
    model = model_of(spec)
    trace = load_trace(trace_path)
    time_scale = TimeScale(spec.time_scale).factor()
    replay = open_loop_replay(
        trace,
        spec.window_s,
        time_scale,
        model.max_model_len,
        warm_prefix_cache=spec.warm_prefix_cache,
    )
    sha = hashlib.sha256(trace_path.read_bytes()).hexdigest()
    return Workload(trace_path, sha, trace, replay, spec.window_s, time_scale, model)


def run_arms(
    run: Run,
    arms: Sequence[Arm],
    repeats: int,
    say: Callable[[str], None] = print,
    part: tuple[int, int] = (0, 1),
    others: Sequence[optuna.Study] = (),
) -> int:
    """Measure what the study lacks of ``repeats`` per arm, in turns; how many trials ran.

    With ``part`` ``(w, n)``, what is lacking is counted over the run's study and ``others``
    (the other parts'), and this part takes its ``share`` of those turns."""
    rows = [r for s in (run.study, *others) for r in rows_of(s.get_trials(deepcopy=False))]
    done = {name: len(found) for name, found in measured(rows, arms).items()}
    todo = rounds(arms, repeats, done)
    index, parts = part
    mine = share(arms, todo, part)
    here = f", {len(mine)} of them in part {index} of {parts}" if parts > 1 else ""
    say(f"{sum(done.values())} measurements in the study, {len(todo)} to take{here}")
    run.calibrate()
    for number, arm in enumerate(mine, 1):
        trial = run.measure(arm.engine_args)
        row = row_of(trial)
        took = f"trial {trial.number} {row.outcome}, value {row.value}"
        say(f"{number}/{len(mine)} {arm.name}: {took}")
    return len(mine)


def parse_part(text: str) -> tuple[int, int]:
    """``W/N`` as ``(W, N)``: part W (from 0) of N."""
    index, _, parts = text.partition("/")
    try:
        found = int(index), int(parts)
    except ValueError:
        found = (-1, 0)
    if not 0 <= found[0] < found[1]:
        raise argparse.ArgumentTypeError(f"{text!r} is not W/N with 0 <= W < N")
    return found


def storages(out: Path) -> list[str]:
    """The studies an A/B wrote in ``out``: its own (``ab.db``) and its parts'."""
    files = [out / "ab.db", *sorted(out.glob("ab-part-*.db"))]
    return [f"sqlite:///{f}" for f in files if f.exists()]


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("arms", type=Path, help="the arms: a YAML or JSON file")
    parser.add_argument("--spec", type=Path, required=True, help="tuner's study spec")
    parser.add_argument("--trace", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True, help="the study and engine logs")
    parser.add_argument("--repeats", type=int, default=3, help="measurements per arm")
    parser.add_argument("--study", default="ab", help="the study's name in its storage")
    parser.add_argument("--storage", help="an Optuna storage URL (default: OUT/ab.db)")
    parser.add_argument(
        "--part", type=parse_part, default=(0, 1), metavar="W/N",
        help="take part W (from 0) of N processes' measurements, into OUT/ab-part-W.db",
    )  # fmt: skip
    parser.add_argument("--launcher", choices=["auto", *LAUNCHERS], default="auto")
    parser.add_argument("--report", action="store_true", help="print the table only")
    return parser.parse_args(argv)


def measure(
    args: argparse.Namespace,
    spec: StudySpec,
    arms: Sequence[Arm],
    load: Callable[[str], optuna.Study],
) -> list[optuna.Study]:
    """Take this process's measurements (its part's, with ``--part``); the studies to report."""
    args.out.mkdir(parents=True, exist_ok=True)
    index, parts = args.part
    own = args.out / ("ab.db" if parts == 1 else f"ab-part-{index}.db")
    storage = args.storage or f"sqlite:///{own}"
    study = load(storage)
    others = [] if args.storage else [u for u in storages(args.out) if u != storage]
    kind = auto_launcher(is_cpu_build()) if args.launcher == "auto" else args.launcher
    runs = args.out / ("runs" if parts == 1 else f"runs-part-{index}")
    runs.mkdir(parents=True, exist_ok=True)
    launcher = LAUNCHERS[kind](runs / "launcher.log")
    # An A/B writes no configuration: Run.result is never asked.
    config = resolve(spec, args.study, runs, runs / "chosen.yaml", storage=storage)
    run = Run(study, spec, workload_of(spec, args.trace), config, launcher=launcher)
    try:
        run_arms(run, arms, args.repeats, part=args.part, others=[load(u) for u in others])
    finally:
        launcher.close()
    return [study] if args.storage else [load(u) for u in storages(args.out)]


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per request otherwise
    spec = load_spec(args.spec)
    memory = host_memory() if is_cpu_build() else None
    arms = load_arms(args.arms, spec, memory, reading=args.report)

    def load(url: str) -> optuna.Study:
        return open_study(args.study, url, spec.seed, objective=of_spec(spec))

    if args.report:  # read only: no study is made where there is none
        found = [load(args.storage)] if args.storage else [load(u) for u in storages(args.out)]
        if not found:
            raise SystemExit(f"{args.out}: no A/B study there")
    else:
        found = measure(args, spec, arms, load)
    print("\n".join(report(found, arms)))
    print(f"command: python {' '.join(sys.argv)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
