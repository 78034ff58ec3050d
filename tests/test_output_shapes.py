"""``benchmarks/output_shapes.py``: a run's printed lines against earlier runs', numbers masked."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from output_shapes import compare, shape


def test_numbers_arguments_and_timestamps_are_masked_but_words_are_not() -> None:
    line = (
        "2026-12-03 05:42:29,460 trial  12  max-num-seqs=32 max-num-batched-tokens=2048  "
        "ttft p95 451 ms, e2e p99 2.76 s"
    )
    assert shape(line) == (
        "trial N max-num-seqs=V max-num-batched-tokens=V ttft p95 N ms, e2e p99 N s"
    )


def test_a_new_wording_and_a_line_every_earlier_run_printed_are_both_found() -> None:
    old = [
        ["trial 0 [feasible] score 1.0", "winner trial 2: score 0.3"],
        ["trial 0 [feasible] score 2.0", "winner trial 3: score 0.4", "within noise"],
    ]
    new = ["trial 0 [feasible] score 1.5", "the winner, trial 2: score 0.3", "within noise"]
    added, missing = compare(new, old)
    assert added == ["the winner, trial N: score N"]
    assert missing == ["winner trial N: score N"]
