"""Run a tuner study one trial at a time until a deadline, on the device machine.

Each iteration is ``tuner run --n-trials 1`` on the same study, so that the study stops
cleanly (best configuration written after every trial) when the next trial would not finish
before ``--deadline-epoch``: a device machine is held at most 30 minutes. After the baseline
(trial 0), the founding story's hand-tuned configuration is enqueued as the next trial, so the
study measures vLLM's defaults, the hand-tuned configuration and the searched ones alike.

Writes under ``--root``: ``study.db``, ``configs/``, ``runs/``, ``tuner.log`` (tuner's own
output) and ``loop.jsonl`` (one line per iteration: its wall time and exit status).
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

# The founding story's hand-tuned configuration.
HAND_TUNED = {
    "max-num-seqs": 16,
    "max-num-batched-tokens": 8192,
    "gpu-memory-utilization": 0.3,
}
HAND_TUNED_ATTR = "hand_tuned"


def enqueue_hand_tuned(study_name: str, storage: str) -> bool:
    """Enqueue the hand-tuned trial once the baseline is complete; True when enqueued now."""
    trials = _trials(study_name, storage)
    if any(t.user_attrs.get(HAND_TUNED_ATTR) for t in trials):
        return False
    if not any(
        t.user_attrs.get("baseline") and t.state == optuna.trial.TrialState.COMPLETE for t in trials
    ):
        return False
    study = optuna.load_study(study_name=study_name, storage=storage)
    study.enqueue_trial(HAND_TUNED, user_attrs={HAND_TUNED_ATTR: True})
    return True


def _trials(study_name: str, storage: str) -> list[optuna.trial.FrozenTrial]:
    """The study's trials; none while ``tuner run`` has not created the study."""
    try:
        study = optuna.load_study(study_name=study_name, storage=storage)
    except KeyError:
        return []
    return study.get_trials(deepcopy=False)


def main(argv: list[str] | None = None) -> int:
    """Run the loop; ``DONE`` is written however it ends, so ``study.sh wait`` returns."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", required=True)
    parser.add_argument("--spec", required=True)
    parser.add_argument("--study", required=True)
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--deadline-epoch", type=float, required=True)
    parser.add_argument("--max-trials", type=int, default=12)
    parser.add_argument("--first-estimate-s", type=float, default=240.0)
    parser.add_argument("--no-hand-tuned", action="store_true")
    args = parser.parse_args(argv)

    root = args.root.resolve()
    try:
        return run_loop(args, root)
    finally:
        (root / "DONE").write_text(time.strftime("%Y-%m-%dT%H:%M:%SZ\n", time.gmtime()))


def run_loop(args: argparse.Namespace, root: Path) -> int:
    storage = f"sqlite:///{root / 'study.db'}"
    child: subprocess.Popen[bytes] | None = None
    stopping: list[int] = []

    def stop(signum: int, frame: Any) -> None:
        # Pass it on and let the main loop end: waiting here, inside Popen.wait, would deadlock.
        stopping.append(signum)
        if child is not None and child.poll() is None:
            child.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    walls: list[float] = []
    log = (root / "loop.jsonl").open("a")
    for iteration in range(args.max_trials):
        if stopping:
            break
        estimate = max(walls, default=args.first_estimate_s)
        left = args.deadline_epoch - time.time()
        if left < estimate:
            print(f"stop: {left:.0f} s left, next trial needs ~{estimate:.0f} s", flush=True)
            break
        command = [
            sys.executable, "-m", "tuner.cli", "-v", "run",
            "--trace", args.trace, "--spec", args.spec, "--study", args.study,
            "--storage", storage, "--n-trials", "1",
            "--configs", str(root / "configs"), "--runs", str(root / "runs"),
        ]  # fmt: skip
        began = time.time()
        with (root / "tuner.log").open("ab") as out:
            child = subprocess.Popen(command, cwd=root, stdout=out, stderr=subprocess.STDOUT)
            rc = child.wait()
        wall_s = time.time() - began
        walls.append(wall_s)
        record = {"iteration": iteration, "start_epoch": began, "wall_s": wall_s, "rc": rc}
        log.write(json.dumps(record) + "\n")
        log.flush()
        print(f"iteration {iteration}: rc {rc}, {wall_s:.0f} s", flush=True)
        if stopping:
            print(f"stop: signal {stopping[0]}", flush=True)
            break
        if rc not in (0, 1):  # 1: no trial met the SLOs yet, the study goes on
            break
        finished = [t for t in _trials(args.study, storage) if t.state.is_finished()]
        if len(finished) <= iteration:
            # tuner itself failed (bad input, import error) before it measured anything.
            print("stop: that run added no trial; see tuner.log", flush=True)
            break
        if not args.no_hand_tuned and enqueue_hand_tuned(args.study, storage):
            print("enqueued the hand-tuned configuration", flush=True)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
