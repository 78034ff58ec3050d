"""The confirmation's rule, alone: three against three with every pair in the finalist's favour
(stopped at the first pair against it) beside the rank test that looks at 4, 6 and 8 of each
(``tuner.study.sequential_plan``), on fresh measurements drawn as ``aa.py`` draws an engine's.

One round is the finalist's and the baseline's fresh measurements in ABBA order: each a capacity
drawn around the configuration's own (log SD and the share of engines reading 30 to 40 % low, as
``aa.py``'s ``SPREADS``; ``flat``: SD 0.01, the GPU studies' engines that read the same rung),
read on the capacity search's 10 % ladder (the highest rung below it). It prints, per spread and
gain of the finalist, the share of rounds that write it and the mean fresh measurements a round
takes. Not the whole pipeline (no search, no finalist chosen among several): the rule's own
size and power; ``aa.py`` measures the pipeline.

    python benchmarks/sequential_power.py              # 20,000 rounds a row
"""

from __future__ import annotations

import argparse
import math
import random
import time
from collections.abc import Callable, Sequence

import aa

from tuner.study import ABBA, WRITE, beats, sequential_plan

SPREADS = {**aa.SPREADS, "flat": (0.01, 0.0)}
GAINS = (1.0, 1.1, 1.2, 1.5, 2.0)
RUNG = math.log(1.1)

Draw = Callable[[bool], float]


def drawer(rng: random.Random, spread: str, gain: float) -> Draw:
    """One fresh measurement of the finalist (True) or the baseline, on the ladder."""
    sd, low = SPREADS[spread]
    offset = rng.random()  # where the ladder's rungs fall, the same for both in a round

    def draw(finalist: bool) -> float:
        value = (math.log(gain) if finalist else 0.0) + rng.gauss(0.0, sd)
        if rng.random() < low:
            value += math.log(rng.uniform(0.6, 0.7))
        return float(math.floor(value / RUNG + offset))

    return draw


def sweep(draw: Draw) -> tuple[bool, int]:
    """Three against three, stopped at the first pair that does not favour the finalist."""
    mine: list[float] = []
    theirs: list[float] = []
    for index in range(6):
        finalist = ABBA[index % len(ABBA)]
        (mine if finalist else theirs).append(draw(finalist))
        if mine and theirs and min(mine) <= max(theirs):
            return False, index + 1
    return beats(mine, theirs), 6


def looks(draw: Draw) -> tuple[bool, int]:
    """The plan's looks, stopped at the first that decides."""
    chosen = sequential_plan()
    mine: list[float] = []
    theirs: list[float] = []
    for index in range(2 * chosen.looks[-1]):
        finalist = ABBA[index % len(ABBA)]
        (mine if finalist else theirs).append(draw(finalist))
        decided = chosen.decide(mine, theirs) if len(mine) == len(theirs) else None
        if decided is not None:
            return decided == WRITE, index + 1
    return False, 2 * chosen.looks[-1]


def row(rule: str, spread: str, gain: float, rounds: int, seed: int) -> str:
    test = sweep if rule == "3v3" else looks
    written = taken = 0
    for n in range(rounds):
        rng = random.Random(f"{seed}-{spread}-{gain}-{n}")
        wrote, measured = test(drawer(rng, spread, gain))
        written += wrote
        taken += measured
    return (
        f"{rule:10} {spread:5} {gain:5.2f} {rounds:7} {written / rounds:8.1%} {taken / rounds:8.1f}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20000)
    parser.add_argument("--seed", type=int, default=0)
    options = parser.parse_args(argv)
    began = time.monotonic()
    plan = sequential_plan()
    print(f"looks {plan.looks}, critical counts {plan.critical}, exact size {plan.size:.4f}")
    print("rule       spread gain  rounds  written  fresh (mean)")
    for spread in SPREADS:
        for gain in GAINS:
            for rule in ("3v3", "4/6/8"):
                print(row(rule, spread, gain, options.rounds, options.seed), flush=True)
    print(f"{time.monotonic() - began:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
