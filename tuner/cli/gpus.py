"""``tuner run --gpus``: one worker per GPU on one study, then one confirmation on one GPU.

The command given runs as a parent that measures nothing itself. It lists the GPUs (nvidia-smi),
reads the trace and the spec once (writing the spec if there is none, so that the workers do not
race to), and starts one ``tuner run`` per GPU: the same command without ``--gpus``, with
``CUDA_VISIBLE_DEVICES`` naming that GPU, its share of the trials (``--n-trials``), the study's
storage (``--storage``: as given, else the journal file ``studies/NAME.log``, which the workers
of one host write at once) and ``--no-confirm``. Each worker's lines are printed as they come,
after ``gpu N |``.

Once every worker has ended, the confirmation (the finalist and the baseline on fresh engines,
in pairs) runs as ``tuner run --confirm-only`` on the first GPU alone, so that each pair is
measured on one device; its lines, the study's result and its exit status are the run's.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO

from tuner.cli.exits import EXIT_INTERRUPTED, EXIT_MEETS_SLOS
from tuner.cli.inputs import read_trace, study_of
from tuner.cli.spec import load_study_spec
from tuner.engine.environment import Gpu, nvidia_smi_gpus, visible_gpus
from tuner.errors import InputError
from tuner.study.store.storage import JOURNAL
from tuner.traces.source import is_stdin
from tuner.urls import shown_url

ALL = "all"

# Seconds the workers have to stop once told to: a trial's server stops within 30 s (SIGTERM to
# its group, then SIGKILL), with room for the worker's own writes to the study.
STOP_WAIT_S = 90.0


def gpus_of(choice: str, query_gpus: Callable[[], str] = nvidia_smi_gpus) -> list[Gpu]:
    """The GPUs ``--gpus`` names: ``all`` (every GPU this process sees), or nvidia-smi indices
    (``0,1,3``). An ``InputError`` where there is no GPU, or an index names none."""
    found = visible_gpus(os.environ, query_gpus)
    if not found:
        raise InputError(f"--gpus {choice}: no GPU found (nvidia-smi lists none)")
    if choice == ALL:
        return found
    by_index = {gpu.index: gpu for gpu in found}
    chosen = []
    for entry in (part.strip() for part in choice.split(",")):
        if not entry.isdigit() or int(entry) not in by_index:
            there = ", ".join(str(i) for i in by_index)
            raise InputError(f"--gpus {choice}: {entry!r} is not a GPU's index here ({there})")
        if by_index[int(entry)] not in chosen:
            chosen.append(by_index[int(entry)])
    return chosen


def shares(n_trials: int, workers: int) -> list[int]:
    """``n_trials`` dealt over ``workers``, the first ones one more where it does not divide."""
    return [n_trials // workers + (1 if i < n_trials % workers else 0) for i in range(workers)]


def without_gpus(argv: Sequence[str]) -> list[str]:
    """``tuner run``'s arguments without ``--gpus`` and its value (any spelling argparse takes:
    ``--gpus X``, ``--gpus=X``, an abbreviation such as ``--gpu X``)."""
    return without(argv, "--gpus")


def without(argv: Sequence[str], *options: str) -> list[str]:
    """``argv`` without each of ``options`` (each taking one value) in any spelling argparse
    takes: ``--name X``, ``--name=X`` or an abbreviation of three characters or more."""
    out: list[str] = []
    skip = False
    for token in argv:
        if skip:
            skip = False
            continue
        option, eq, _ = token.partition("=")
        if (
            len(option) >= 3
            and option.startswith("--")
            and any(name.startswith(option) for name in options)
        ):
            skip = not eq
            continue
        out.append(token)
    return out


# What the parent sets for each child: given once, not after the user's own.
SET_FOR_EACH = ("--gpus", "--n-trials", "--time-budget-s", "--storage")


def run_on_gpus(args: argparse.Namespace) -> int:
    """``tuner run --gpus``: the workers, then the confirmation; the confirmation's exit status
    (a worker's, where none added its trials)."""
    gpus = gpus_of(args.gpus)
    if args.confirm_only or args.no_confirm:
        given = "--confirm-only" if args.confirm_only else "--no-confirm"
        raise InputError(
            f"--gpus adds trials on several GPUs and then confirms on one; {given} is for one "
            "worker (CUDA_VISIBLE_DEVICES=N tuner run ..., docs/workers.md)"
        )
    if is_stdin(args.trace):
        raise InputError("--gpus: each GPU's worker reads the trace: give a file, not -")
    began = time.monotonic()
    name = study_of(args)
    spec = load_study_spec(args, name, read_trace(args).trace)
    n_trials = spec.n_trials if args.n_trials is None else args.n_trials
    storage = args.storage
    if storage is None:
        Path("studies").mkdir(exist_ok=True)
        storage = f"{JOURNAL}studies/{name}.log"
    base = [
        sys.executable,
        "-m",
        "tuner.cli",
        *without(args.argv, *SET_FOR_EACH),
        "--storage",
        storage,
    ]
    dealt = [(gpu, k) for gpu, k in zip(gpus, shares(n_trials, len(gpus)), strict=True) if k]
    print(
        f"{len(dealt)} worker{'s' if len(dealt) != 1 else ''}, one per GPU, {n_trials} trials "
        f"in all, on study {name!r} in "
        f"{shown_url(storage)}; then the confirmation on GPU {gpus[0].index}"
    )
    budget = [] if args.time_budget_s is None else ["--time-budget-s", f"{args.time_budget_s:g}"]
    workers = [
        (gpu, [*base, "--n-trials", str(k), *budget, "--no-confirm"], _on(gpu)) for gpu, k in dealt
    ]
    for gpu, argv, _ in workers:
        print(f"gpu {gpu.index} | {gpu.name} ({gpu.uuid}): {_said(argv, gpu)}")
    codes = _run_all(workers)
    failed = [f"GPU {gpu.index}: {code}" for (gpu, _, _), code in zip(workers, codes, strict=True)]
    failed = [said for said, code in zip(failed, codes, strict=True) if code != EXIT_MEETS_SLOS]
    if EXIT_INTERRUPTED in codes:
        return EXIT_INTERRUPTED
    if workers and len(failed) == len(workers):
        print(f"no worker added its trials (exit status {', '.join(failed)})")
        return codes[0]
    if failed:
        print(f"workers that failed (exit status): {', '.join(failed)}")
    confirm = [*base, "--confirm-only"]
    if args.time_budget_s is not None:
        left_s = max(args.time_budget_s - (time.monotonic() - began), 1.0)
        confirm += ["--time-budget-s", f"{left_s:.0f}"]
    first = gpus[0]
    print(f"\nconfirming on GPU {first.index} alone: {_said(confirm, first)}")
    return _run_all([(first, confirm, _on(first))], prefix=False)[0]


def _on(gpu: Gpu) -> dict[str, str]:
    return {**os.environ, "CUDA_VISIBLE_DEVICES": str(gpu.index)}


def _said(argv: Sequence[str], gpu: Gpu) -> str:
    """The worker's command as a person would type it."""
    words = ["tuner", *argv[3:]]
    words = [shown_url(w) if w.startswith(("postgresql", "mysql")) else w for w in words]
    return f"CUDA_VISIBLE_DEVICES={gpu.index} " + " ".join(words)


def _run_all(
    workers: Sequence[tuple[Gpu, list[str], dict[str, str]]], prefix: bool = True
) -> list[int]:
    """Run every worker at once, printing each line it writes as it comes (after ``gpu N |``
    where ``prefix``); their exit statuses. Ctrl-C or SIGTERM stops them (``_stop``)."""
    lock = threading.Lock()
    procs = []
    readers = []
    try:
        for gpu, argv, env in workers:
            proc = subprocess.Popen(
                argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, bufsize=0
            )
            procs.append(proc)
            head = f"gpu {gpu.index} | " if prefix else ""
            assert proc.stdout is not None
            reader = threading.Thread(target=_relay, args=(proc.stdout, head, lock), daemon=True)
            reader.start()
            readers.append(reader)
        codes = [proc.wait() for proc in procs]
    except KeyboardInterrupt:
        _stop(procs)
        raise
    for reader in readers:
        reader.join(timeout=5)
    return codes


def _stop(procs: Sequence[subprocess.Popen[bytes]]) -> None:
    """SIGTERM to each worker still running, as tuner stops on it (its running trial marked
    FAIL, its server stopped); one that has not ended ``STOP_WAIT_S`` later is killed, its trial
    left to its lease."""
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    deadline = time.monotonic() + STOP_WAIT_S
    for proc in procs:
        try:
            proc.wait(timeout=max(deadline - time.monotonic(), 0.0))
        except subprocess.TimeoutExpired:
            print(f"a worker (pid {proc.pid}) did not stop in {STOP_WAIT_S:.0f} s: killed; its "
                  "trial is failed once its lease runs out", file=sys.stderr)  # fmt: skip
            proc.kill()
            proc.wait()


def _relay(stream: IO[bytes], head: str, lock: threading.Lock) -> None:
    """Print ``stream``'s lines after ``head`` until it ends; a live line's redraws (``\\r``)
    are kept to their last state."""
    for raw in iter(stream.readline, b""):
        line = raw.decode(errors="replace").rstrip("\n").rpartition("\r")[2]
        with lock:
            print(head + line, flush=True)
