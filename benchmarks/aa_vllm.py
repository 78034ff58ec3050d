"""A/A studies on real vLLM engines: a candidate that spells out vLLM's defaults, confirmed
against them; a searched configuration must (almost) never be written.

    python benchmarks/aa_vllm.py --studies 20 --out /tmp/aa-vllm     # on vLLM's CPU build

Each study is one `tuner run` in a folder of its own (its own seed): the Quick start's spec and
trace at a fixed time scale (`--time-scale`, the demo's calibration on the machine: 4.76 on the
2-core development machine), two trials (vLLM's defaults, then the candidate that sets vLLM's
own values of max-num-seqs and max-num-batched-tokens), and the confirmation as the default spec
asks (3 fresh engines each, stopped at the first pair against the candidate). It
prints each study's exit status (0: a searched configuration written; 4: the defaults kept),
its verdict line and time, then how many wrote a change. The engines are the same
configuration, so each study that exits 0 is a false positive; the rule allows 1 in 20.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
TRACE = REPO / "traces" / "azure-conv-peak.csv"
DEMO = REPO / "studies" / "demo.yaml"
# vLLM's own values on its CPU build (the demo's space defaults).
DEFAULTS = {"max-num-seqs": 128, "max-num-batched-tokens": 2048}


def spec(seed: int, time_scale: float) -> dict[str, object]:
    """The Quick start's spec (its model, engine arguments, SLOs and window), at a fixed time
    scale (the demo's calibration, measured once, instead of one per study), with vLLM's defaults
    spelled out as its one candidate and no search beyond it."""
    demo = yaml.safe_load(DEMO.read_text())
    demo.update(
        candidates=[dict(DEFAULTS)], n_trials=2, seed=seed, time_scale=time_scale,
        time_budget_s=None,
    )  # fmt: skip
    return demo


def one(folder: Path, seed: int, time_scale: float) -> tuple[int, str, float]:
    """One A/A study: its exit status, its verdict line and its seconds."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "studies").mkdir(exist_ok=True)
    (folder / "studies" / "aa.yaml").write_text(yaml.safe_dump(spec(seed, time_scale)))
    began = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "tuner.cli", "run", "--trace", str(TRACE), "--study", "aa",
         "--spec", "studies/aa.yaml"],
        cwd=folder, capture_output=True, text=True, check=False,
    )  # fmt: skip
    (folder / "run.log").write_text(done.stdout + done.stderr)
    took = time.monotonic() - began
    said = re.search(r"^(vLLM's defaults kept: .*|beats vLLM's defaults .*)$", done.stdout, re.M)
    return done.returncode, said.group(1) if said else done.stdout.strip()[-200:], took


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--studies", type=int, default=20)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--time-scale", type=float, default=4.76, help="the demo's calibrated scale on this machine"
    )
    options = parser.parse_args(argv)
    print(f"$ python benchmarks/aa_vllm.py {' '.join(sys.argv[1:])}", flush=True)
    written = 0
    for n in range(options.studies):
        code, said, took = one(options.out / f"study-{n:02d}", n, options.time_scale)
        written += code == 0
        print(f"study {n:2d}: exit {code} in {took:.0f} s: {said}", flush=True)
    print(f"{written} of {options.studies} A/A studies wrote a searched configuration")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
