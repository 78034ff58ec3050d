"""What a confirming measurement costs against a searched trial, in the GPU studies kept here:
the evidence behind how ``tuner.study.trials.budget.Budget`` plans a run's time
(``GPU_CONFIRM_SHARE`` and leaving the run's first trial out).

    python benchmarks/confirm_share.py [DB ...]     (default: benchmarks/results/h*-*/*.db)

For each study with both, the first searched trial, the longest searched trial after it, the
longest confirming measurement (``time_trial_s``; a trial with ``confirms`` re-measures an
earlier one), and the longest confirming measurement's ratio to the longest searched trial and
to the longest searched trial after the first; then the ratios' ranges and medians.
"""

from __future__ import annotations

import json
import sqlite3
import statistics
import sys
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def costs(db: Path) -> tuple[list[float], list[float]]:
    """The seconds each searched trial and each confirming measurement of ``db``'s study took,
    in trial order."""
    rows = sqlite3.connect(db).execute(
        "select t.number, a.key, a.value_json from trials t join trial_user_attributes a"
        " on a.trial_id = t.trial_id where a.key in ('time_trial_s', 'confirms')"
    )
    trials: dict[int, dict[str, Any]] = {}
    for number, key, value in rows:
        trials.setdefault(number, {})[key] = json.loads(value)
    timed = [trials[n] for n in sorted(trials) if "time_trial_s" in trials[n]]
    searched = [float(t["time_trial_s"]) for t in timed if "confirms" not in t]
    confirming = [float(t["time_trial_s"]) for t in timed if "confirms" in t]
    return searched, confirming


def _range(name: str, values: list[float]) -> str:
    return f"{name} {min(values):.2f} to {max(values):.2f}, median {statistics.median(values):.2f}"


def main(argv: list[str]) -> int:
    dbs = [Path(a) for a in argv] or sorted(RESULTS.glob("h*-*/*.db"))
    to_longest, to_later = [], []
    print(
        "| study | searched: first / longest after it s (n) | confirming: longest s (n)"
        " | ratio to the longest | ratio to the longest after the first |"
    )
    print("|---|---|---|---|---|")
    for db in dbs:
        searched, confirming = costs(db)
        if not searched or not confirming:
            continue
        again = max(confirming)
        to_longest.append(again / max(searched))
        later = f"{max(searched[1:]):.0f}" if len(searched) > 1 else "-"
        ratio_later = "-"
        if len(searched) > 1:
            to_later.append(again / max(searched[1:]))
            ratio_later = f"{to_later[-1]:.2f}"
        print(
            f"| {db.parent.name}/{db.name} | {searched[0]:.0f} / {later} ({len(searched)})"
            f" | {again:.0f} ({len(confirming)}) | {to_longest[-1]:.2f} | {ratio_later} |"
        )
    if to_longest:
        print(f"\n{len(to_longest)} studies: " + _range("ratio to the longest", to_longest))
    if to_later:
        print(
            f"{len(to_later)} studies: " + _range("ratio to the longest after the first", to_later)
        )
    print(f"\nrerun: python benchmarks/confirm_share.py {' '.join(argv)}".rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
