"""What a confirming measurement costs against a searched trial, in the GPU studies kept here:
the evidence behind ``tuner.study.trials.budget.GPU_CONFIRM_SHARE``.

    python benchmarks/confirm_share.py [DB ...]     (default: benchmarks/results/h*-*/*.db)

For each study with both, the longest searched trial and the longest confirming measurement
(``time_trial_s``; a trial with ``confirms`` re-measures an earlier one), their medians, and the
ratio of the two longest; then the ratios' range and median.
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
    """The seconds each searched trial and each confirming measurement of ``db``'s study took."""
    rows = sqlite3.connect(db).execute(
        "select trial_id, key, value_json from trial_user_attributes"
        " where key in ('time_trial_s', 'confirms')"
    )
    trials: dict[int, dict[str, Any]] = {}
    for trial_id, key, value in rows:
        trials.setdefault(trial_id, {})[key] = json.loads(value)
    timed = [t for t in trials.values() if "time_trial_s" in t]
    searched = [float(t["time_trial_s"]) for t in timed if "confirms" not in t]
    confirming = [float(t["time_trial_s"]) for t in timed if "confirms" in t]
    return searched, confirming


def main(argv: list[str]) -> int:
    dbs = [Path(a) for a in argv] or sorted(RESULTS.glob("h*-*/*.db"))
    ratios = []
    print(
        "| study | searched: longest / median s (n) | confirming: longest / median s (n) | ratio |"
    )
    print("|---|---|---|---|")
    for db in dbs:
        searched, confirming = costs(db)
        if not searched or not confirming:
            continue
        ratio = max(confirming) / max(searched)
        ratios.append(ratio)
        longest, median = max(searched), statistics.median(searched)
        again, again_median = max(confirming), statistics.median(confirming)
        print(
            f"| {db.parent.name}/{db.name} | {longest:.0f} / {median:.0f} ({len(searched)})"
            f" | {again:.0f} / {again_median:.0f} ({len(confirming)}) | {ratio:.2f} |"
        )
    if ratios:
        print(
            f"\n{len(ratios)} studies: ratio {min(ratios):.2f} to {max(ratios):.2f}, "
            f"median {statistics.median(ratios):.2f}"
        )
    print(f"\nrerun: python benchmarks/confirm_share.py {' '.join(argv)}".rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
