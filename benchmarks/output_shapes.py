"""Whether a run's printed output says what earlier runs said, its numbers masked.

A refactor should move code, not change what ``tuner run`` prints. Measured numbers, pids,
times of day and the configurations a search happens to visit differ between any two runs, so
each line is reduced to its shape: digits to ``N``, engine arguments to ``NAME=V``, and the
trial number's padding collapsed. A line of the new run is new where its shape appears in none
of the earlier runs; a shape of the earlier runs that every one of them printed is missing where
the new run never printed it.

    python benchmarks/output_shapes.py NEW.log OLD.log [OLD.log ...]

prints both lists and exits 1 where either is not empty.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

_TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ ")
_ARGUMENT = re.compile(r"\b([a-z][a-z0-9-]*)=\S+")
_NUMBER = re.compile(r"(?<![\w.])\d+(\.\d+)?")
_SPACES = re.compile(r" {2,}")


def shape(line: str) -> str:
    """The line with its timestamp dropped, engine arguments' values, numbers and runs of
    spaces masked."""
    line = _TIMESTAMP.sub("", line.rstrip("\n"))
    line = _ARGUMENT.sub(r"\1=V", line)
    line = _NUMBER.sub("N", line)
    return _SPACES.sub(" ", line).strip()


def shapes(lines: Iterable[str]) -> set[str]:
    return {s for s in map(shape, lines) if s}


def compare(new: Sequence[str], old: Sequence[Sequence[str]]) -> tuple[list[str], list[str]]:
    """The new run's shapes no earlier run printed, and the shapes every earlier run printed
    that the new one did not."""
    new_shapes = shapes(new)
    old_shapes = [shapes(run) for run in old]
    seen = set().union(*old_shapes)
    always = set.intersection(*old_shapes) if old_shapes else set()
    return sorted(new_shapes - seen), sorted(always - new_shapes)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("new", type=Path)
    parser.add_argument("old", type=Path, nargs="+")
    args = parser.parse_args(argv)
    new = args.new.read_text().splitlines()
    old = [path.read_text().splitlines() for path in args.old]
    added, missing = compare(new, old)
    print(f"{len(added)} line shapes new in {args.new}:")
    for line in added:
        print(f"  + {line}")
    print(f"{len(missing)} line shapes every earlier run printed, missing:")
    for line in missing:
        print(f"  - {line}")
    return 1 if added or missing else 0


if __name__ == "__main__":
    sys.exit(main())
