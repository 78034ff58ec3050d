"""Windows per capacity search, before and after the saturating window: simulated, no engine.

The capacity search (``tuner.study.capacity.rates.search_capacity``) is run against simulated
servers whose capacity is known: a window passes at or below it and fails above. Each server
also sustains a throughput, the capacity over its share of it (``--shares``: 0.8 where the
capacity is 80 % of the throughput); a saturating window reads that throughput times
``--read`` (below 1: read low), or, offered below it, the rate offered. Two rules:

- ``doubling`` (the rule before): a study's first search doubles or halves from the window's
  rate, then bisects; a later one doubles from a neighbour's capacity, or starts with two
  resolutions from its own (a re-measurement);
- ``saturating`` (the rule now): a study's first search begins with one saturating window and
  bisects below its bound; a later one starts with two resolutions from its own capacity or its
  nearest neighbour's.

Part 1 is a study's first search, over capacities (``--capacities``), shares and the window's
rate as a share of the capacity (``--starts``); part 2 a later search from a measured capacity
(its own or a neighbour's) that the true capacity is ``--hints`` times. Each prints, per row,
the windows of each search (median and most), the share of searches within the target (4
windows for a first search, 3 for a later one), and the share that landed: resolved, the
capacity found within the resolution below the true one (not, where the window limit ended
the search first). Seconds: none; run it anywhere:

    python benchmarks/capacity_windows.py
    python benchmarks/capacity_windows.py --resolution 0.05 --read 0.9 1.0 1.1
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import harness

from tuner.study import (
    SUSTAINED,
    CapacityFound,
    CapacitySettings,
    RatePoint,
    StartHint,
    search_capacity,
)

FIRST_TARGET = 4
LATER_TARGET = 3


@dataclass(frozen=True)
class Server:
    """A simulated server: its capacity, and the throughput a saturating window reads."""

    capacity_req_per_s: float
    read_req_per_s: float

    def measure(self, rate: float) -> RatePoint:
        return RatePoint(rate, rate <= self.capacity_req_per_s)

    def saturate(self, rate: float) -> RatePoint:
        sustained = min(rate, self.read_req_per_s)
        return RatePoint(rate, rate <= self.capacity_req_per_s, {SUSTAINED: sustained})


def landed(found: CapacityFound, server: Server, resolution: float) -> bool:
    capacity, true = found.capacity_req_per_s, server.capacity_req_per_s
    return found.resolved and capacity <= true < capacity * (1 + resolution) * (1 + 1e-9)


Search = Callable[[Server, float], CapacityFound]


def first_searches(options: argparse.Namespace) -> dict[str, Search]:
    """A study's first search: doubling from the window's rate, or the saturating window first
    (as ``CapacitySettings.saturates`` asks, where no capacity was measured to start from)."""
    res, most, floor = options.resolution, options.max_windows, options.floor_req_per_s
    return {
        "doubling": lambda server, start: search_capacity(server.measure, start, res, most, floor),
        "saturating": lambda server, start: search_capacity(
            server.measure, start, res, most, floor, saturate=server.saturate
        ),
    }


def later_searches(options: argparse.Namespace) -> dict[str, Search]:
    """A later search from a neighbour's capacity: doubling from it, or the first step that
    ``CapacitySettings.first_step`` gives a hinted search."""
    res, most, floor = options.resolution, options.max_windows, options.floor_req_per_s

    def hinted(server: Server, hint: float) -> CapacityFound:
        settings = CapacitySettings((), 1.0, resolution=res, hint=StartHint(hint, repeat=False))
        return search_capacity(
            server.measure, hint, res, most, floor, first_step=settings.first_step
        )

    return {
        "doubling": lambda server, hint: search_capacity(server.measure, hint, res, most, floor),
        "saturating": hinted,
    }


@dataclass
class Tally:
    """Each search's windows, and how many landed within the resolution."""

    windows: list[int] = field(default_factory=list)
    landed: int = 0

    def add(self, found: CapacityFound, server: Server, resolution: float) -> None:
        self.windows.append(len(found.points))
        self.landed += landed(found, server, resolution)


def row(label: str, tallies: dict[str, Tally], target: int) -> str:
    cells = [f"{label:>14}"]
    for tally in tallies.values():
        windows = tally.windows
        within = sum(1 for n in windows if n <= target) / len(windows)
        landed_share = tally.landed / len(windows)
        cells.append(
            f"{statistics.median(windows):6.1f} {max(windows):4d} {within:5.0%} {landed_share:6.0%}"
        )
    return "  ".join(cells)


def header(rules: Sequence[str], what: str) -> str:
    cells = [f"{what:>14}"] + [f"{rule + ': median most ok landed':>29}" for rule in rules]
    return "  ".join(cells)


def first_part(options: argparse.Namespace) -> None:
    searches = first_searches(options)
    print(
        f"\nPart 1: a study's first search, resolution {options.resolution:.0%}, at most "
        f"{options.max_windows} windows; 'ok' is the share within {FIRST_TARGET} windows"
    )
    print(f"capacities {options.capacities} req/s, throughput read x{options.read}")
    print(f"window's rate as a share of the capacity: {options.starts}")
    print(header(list(searches), "capacity share"))
    for share in options.shares:
        tallies = first_tallies(options, searches, [share], options.starts)
        print(row(f"{share:.2f}", tallies, FIRST_TARGET))
    print(header(list(searches), "window's rate"))
    for start in options.starts:
        tallies = first_tallies(options, searches, options.shares, [start])
        print(row(f"x{start:.3g}", tallies, FIRST_TARGET))


def first_tallies(
    options: argparse.Namespace,
    searches: dict[str, Search],
    shares: Sequence[float],
    starts: Sequence[float],
) -> dict[str, Tally]:
    """Each rule's first searches over every capacity, throughput read, and the ``shares`` and
    ``starts`` given (the capacity as a share of the throughput; the window's rate as a share
    of the capacity)."""
    tallies = {rule: Tally() for rule in searches}
    for capacity, share, start, read in itertools.product(
        options.capacities, shares, starts, options.read
    ):
        server = Server(capacity, capacity / share * read)
        for rule, search in searches.items():
            tallies[rule].add(search(server, capacity * start), server, options.resolution)
    return tallies


def later_part(options: argparse.Namespace) -> None:
    searches = later_searches(options)
    print(
        f"\nPart 2: a later search from a capacity measured in the study (a neighbour's), "
        f"resolution {options.resolution:.0%}; 'ok' is the share within {LATER_TARGET} windows"
    )
    print(header(list(searches), "capacity/hint"))
    for ratio in options.hints:
        tallies = {rule: Tally() for rule in searches}
        for capacity in options.capacities:
            server = Server(capacity, capacity)
            for rule, search in searches.items():
                tallies[rule].add(search(server, capacity / ratio), server, options.resolution)
        print(row(f"{ratio:g}", tallies, LATER_TARGET))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--resolution", type=float, default=0.1)
    parser.add_argument("--max-windows", type=int, default=10, help="capacity_max_probes")
    parser.add_argument(
        "--floor-req-per-s", type=float, default=10 / 30, help="10 requests in 30 s"
    )
    parser.add_argument(
        "--capacities", type=float, nargs="+", default=[0.8, 2.5, 9.0, 24.0, 87.5, 300.0]
    )
    parser.add_argument(
        "--shares", type=float, nargs="+", default=[0.2, 0.35, 0.5, 0.6, 0.7, 0.8, 0.9, 0.97]
    )
    parser.add_argument(
        "--starts", type=float, nargs="+", default=[1 / 64, 1 / 20, 1 / 8, 1 / 3, 1.0, 1.5]
    )
    parser.add_argument("--read", type=float, nargs="+", default=[1.0])
    parser.add_argument(
        "--hints", type=float, nargs="+", default=[0.5, 0.7, 0.83, 0.95, 1.05, 1.2, 1.4, 2.0]
    )
    parser.add_argument("--result", metavar="NAME", help="write benchmarks/results/NAME/")
    options = parser.parse_args()
    with harness.Printed() as printed:
        first_part(options)
        later_part(options)
        print(f"\nrerun: python benchmarks/capacity_windows.py {' '.join(sys.argv[1:])}".rstrip())
    if options.result:
        title = "Windows per capacity search, before and after the saturating window (simulated)"
        folder = harness.RESULTS / options.result
        harness.write_result(folder, title, harness.command_line(), printed.text())


if __name__ == "__main__":
    main()
