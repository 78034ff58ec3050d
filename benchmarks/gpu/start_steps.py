"""Where each engine's start went, step by step, from the engine logs a GPU run brought back.

    python benchmarks/gpu/start_steps.py benchmarks/results/h100-story \
        benchmarks/results/h100-fork benchmarks/results/h100-capture

Every ``engine.log`` (and ``*.engine.log``) under the folders given: the compile key and whether
vLLM's compile cache served it, the steps of ``tuner.engine.startup.steps`` (vLLM's log times,
whole seconds) and vLLM's own torch.compile figures, as a markdown table.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tuner.engine import STEPS, compile_cache, reported_durations, steps

FIGURES = ("dynamo_s", "graph_compile_s", "graph_load_s")


def row(path: Path, root: Path) -> str:
    text = path.read_text(errors="replace")
    found, durations, cache = steps(text), reported_durations(text), compile_cache(text)
    name = str(path.relative_to(root)).removesuffix("engine.log").rstrip("./") or path.name
    cells = [f"{found[f'step_{s}_s']:.0f}" if f"step_{s}_s" in found else "-" for s, _ in STEPS]
    cells += [f"{sum(found.values()):.0f}"]
    cells += [f"{durations[f]:.1f}" if f in durations else "-" for f in FIGURES]
    hit = cache.get("compile_cache_hit")
    return f"| {name} | {cache.get('compile_key', '-')} | {hit} | " + " | ".join(cells) + " |"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", type=Path, nargs="+")
    args = parser.parse_args(argv)
    head = [s for s, _ in STEPS] + ["sum"] + [f[:-2] for f in FIGURES]
    print("| engine | compile key | cache hit | " + " | ".join(head) + " |")
    print("|---|---|---|" + "---|" * len(head))
    for folder in args.folders:
        logs = sorted({*folder.rglob("engine.log"), *folder.rglob("*.engine.log")})
        for path in logs:
            print(row(path, folder.parent))
    return 0


if __name__ == "__main__":
    sys.exit(main())
