"""Every study kept in benchmarks/results judged again by the confirmation's rule: only
measurements taken after the search count, as many of each and at least 3, each of the
finalist's better than each of the baseline's.

    python benchmarks/rejudge.py                    # every *.db under benchmarks/results
    python benchmarks/rejudge.py path/to/study.db   # one study

Studies measured before the rule carry no ``fresh_for`` attribute: their re-measurements (trials
with ``confirms``) were taken after the search, on fresh engines, in turns, so they stand in for
the fresh measurements here. The finalist is chosen as ``tuner.study.trials.confirm.finalist``
chooses it (by the search's measurements only). For each study the line gives the finalist, the
fresh counts, every fresh value of each, the ratio of the medians with the 90% interval, the
exact p, and the verdict.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import optuna

from tuner.study import (
    MIN_FRESH,
    Group,
    TrialRecord,
    beats,
    finalist,
    groups,
    p_value,
    rank,
    ratio,
    ratio_interval,
)

RESULTS = Path(__file__).resolve().parent / "results"


def _after_search(group: Group) -> Group:
    """``group``'s measurements taken after the search: its re-measurements."""
    again = tuple(t for t in group.trials if TrialRecord.of(t).confirms is not None)
    return Group(group.first, again, group.objective)


def judge(path: Path) -> list[str]:
    """One line per study in the SQLite file at ``path``."""
    storage = f"sqlite:///{path}"
    lines = []
    for summary in optuna.get_all_study_summaries(storage):
        study = optuna.load_study(study_name=summary.study_name, storage=storage)
        lines.append(f"{path.relative_to(RESULTS.parent)} {summary.study_name}: {_verdict(study)}")
    return lines


def _verdict(study: optuna.Study) -> str:
    served = groups(study)
    baseline = rank(served)[1]
    chosen = finalist(served)
    if baseline is None or chosen is None:
        return "no finalist (nothing searched met the SLOs, or no baseline): nothing to judge"
    mine, theirs = _after_search(chosen), _after_search(baseline)
    a, b = mine.oriented(), theirs.oriented()
    values = f"{_listed(mine.values)} against {_listed(theirs.values)}"
    head = f"finalist trial {chosen.number}, {len(a)} fresh against {len(b)}: {values}"
    if not a or not b:
        return f"{head}; no verdict (no measurement after the search)"
    positive = [mine.objective.upward(v) for v in mine.values if v > 0]
    others = [theirs.objective.upward(v) for v in theirs.values if v > 0]
    median_ratio = ratio(positive, others)
    interval = ratio_interval(positive, others)
    times = "" if median_ratio is None else f"; {median_ratio:.2f}x"
    if interval is not None and median_ratio is not None:
        times += f" (90% interval {interval[0]:.2f} to {interval[1]:.2f}x)"
    p = p_value(a, b)
    if beats(a, b):
        verdict = "confirmed"
    elif min(len(a), len(b)) < MIN_FRESH:
        verdict = f"too few to confirm (fewer than {MIN_FRESH} each)"
    else:
        verdict = "not confirmed"
    return f"{head}{times}; p = {p:.2g}: {verdict}"


def _listed(values: list[float]) -> str:
    return "[" + ", ".join(f"{v:.4g}" for v in values) + "]"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python benchmarks/rejudge.py",
        description=__doc__.split("\n\n")[0].replace("\n", " "),
    )
    parser.add_argument(
        "db",
        nargs="*",
        help="SQLite study files to judge (default: every *.db under benchmarks/results)",
    )
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    # SQLite would create a file that is not there: a mistyped path is refused instead.
    missing = [a for a in args.db if not Path(a).is_file()]
    if missing:
        parser.error(f"no such file: {', '.join(missing)}")
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    paths = [Path(a).resolve() for a in args.db] or sorted(RESULTS.rglob("*.db"))
    print(f"$ python benchmarks/rejudge.py {' '.join(args.db)}".rstrip())
    for path in paths:
        try:
            for line in judge(path):
                print(line)
        except Exception as exc:  # a database of another kind (an A/B's), said and skipped
            print(f"{path.relative_to(RESULTS.parent)}: not read ({type(exc).__name__}: {exc})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
