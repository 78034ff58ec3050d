"""Run a tuner study on the device machine until a deadline, in one ``tuner run``.

One process, so that tuner's zygote launcher imports vLLM once for the whole study, with
``--time-budget-s`` set so that no trial starts that would end after ``--deadline-epoch``
(a device machine is held at most 30 minutes). The founding story's hand-tuned configuration
is a ``candidates`` entry of the workloads' specs, so the study measures vLLM's defaults
(trial 0), the hand-tuned configuration (trial 1) and then searched ones.

Writes under ``--root``: ``study.db``, ``configs/``, ``runs/``, ``tuner.log`` (tuner's own
output) and ``loop.jsonl`` (the run's wall time and exit status).

A study longer than one machine's time goes on in the next from its ``study.db`` (``study.sh``
copies a carried one in, ``RESUME_DB``): with ``--total-trials N`` the loop adds only the trials
the study lacks of N (re-measurements of the confirm step not counted), and once it has them all,
runs ``tuner run --confirm-only`` to finish the confirmation.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import optuna

from tuner.study import CONFIRMS_ATTR

# Seconds kept back from the deadline for tuner to write its result and stop its launcher.
MARGIN_S = 20.0


def _trials(study_name: str, storage: str) -> list[optuna.trial.FrozenTrial]:
    """The study's trials; none while ``tuner run`` has not created the study."""
    try:
        study = optuna.load_study(study_name=study_name, storage=storage)
    except KeyError:
        return []
    return study.get_trials(deepcopy=False)


def _first_measurement(trial: optuna.trial.FrozenTrial) -> bool:
    """A trial that measured its configuration (completed or pruned) and is not a
    re-measurement of the confirm step; a trial cut off by the end of a run is FAIL and does
    not count."""
    measured = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
    return trial.state in measured and CONFIRMS_ATTR not in trial.user_attrs


def main(argv: list[str] | None = None) -> int:
    """Run the loop; ``DONE`` is written however it ends, so ``study.sh wait`` returns."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", required=True)
    parser.add_argument("--spec", required=True)
    parser.add_argument("--study", required=True)
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--deadline-epoch", type=float, required=True)
    parser.add_argument("--max-trials", type=int, default=12, help="trials to add")
    parser.add_argument(
        "--total-trials", type=int, help="trials the study should hold (instead of --max-trials)"
    )
    parser.add_argument("--first-estimate-s", type=float, default=180.0)
    args = parser.parse_args(argv)

    root = args.root.resolve()
    try:
        return run_loop(args, root)
    finally:
        (root / "DONE").write_text(time.strftime("%Y-%m-%dT%H:%M:%SZ\n", time.gmtime()))


def run_loop(args: argparse.Namespace, root: Path) -> int:
    storage = f"sqlite:///{root / 'study.db'}"
    child: subprocess.Popen[bytes] | None = None

    def stop(signum: int, frame: Any) -> None:
        # Pass it on: tuner marks the running trial failed and stops its engine.
        if child is not None and child.poll() is None:
            child.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    budget_s = args.deadline_epoch - time.time() - MARGIN_S
    if budget_s < args.first_estimate_s:
        print(f"stop: {budget_s:.0f} s left, a first trial needs ~{args.first_estimate_s:.0f} s")
        return 0
    add = args.max_trials
    if args.total_trials is not None:
        held = [t for t in _trials(args.study, storage) if _first_measurement(t)]
        add = max(0, args.total_trials - len(held))
        print(f"the study holds {len(held)} of {args.total_trials} trials: adding {add}")
    how_many = ["--n-trials", str(add)] if add else ["--confirm-only"]
    command = [
        sys.executable, "-m", "tuner.cli", "-v", "run",
        "--trace", args.trace, "--spec", args.spec, "--study", args.study,
        "--storage", storage, *how_many,
        "--time-budget-s", f"{budget_s:.0f}",
        "--configs", str(root / "configs"), "--runs", str(root / "runs"),
    ]  # fmt: skip
    began = time.time()
    with (root / "tuner.log").open("ab") as out:
        child = subprocess.Popen(command, cwd=root, stdout=out, stderr=subprocess.STDOUT)
        rc = child.wait()
    wall_s = time.time() - began
    finished = [t for t in _trials(args.study, storage) if t.state.is_finished()]
    record = {"start_epoch": began, "wall_s": wall_s, "rc": rc, "trials": len(finished)}
    with (root / "loop.jsonl").open("a") as log:
        log.write(json.dumps(record) + "\n")
    print(f"tuner run: rc {rc}, {wall_s:.0f} s, {len(finished)} trials in the study", flush=True)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
