"""``tuner run --gpus``: one worker per GPU, or per group of GPUs, on one study, then one
confirmation on one GPU or group.

The command given runs as a parent that measures nothing itself. It lists the GPUs (nvidia-smi),
reads the trace and the spec once (writing the spec if there is none, so that the workers do not
race to), and picks the layout each server runs at (``tuner.cli.layouts``: a capacity or goodput
study first measures the layouts the model fits, one ``tuner run --layout`` each). It then
starts one ``tuner run`` per group of GPUs of the layout's size (one GPU for vLLM's default
layout): the same command without ``--gpus``, with ``CUDA_VISIBLE_DEVICES`` naming the group,
its share of the trials (``--n-trials``), the study's storage (``--storage``: as given, else the
journal file ``studies/NAME.log``, which the workers of one host write at once), the layout
(``--layout``, where it is not vLLM's default) and ``--no-confirm``. Each worker's lines are
printed as they come, after ``gpu N |`` (``gpus N,M |``).

Once every worker has ended, the confirmation (the finalist and the baseline on fresh engines,
in pairs) runs as ``tuner run --confirm-only`` on the first group alone, so that each pair is
measured on one device; its lines, the study's result and its exit status are the run's.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from tuner.cli.children import Child, head_of, indices, run_all
from tuner.cli.exits import EXIT_INTERRUPTED, EXIT_MEETS_SLOS
from tuner.cli.inputs import read_trace, study_of
from tuner.cli.layouts import groups_of, measure_layouts, plan_of
from tuner.cli.spec import load_study_spec
from tuner.engine.environment import Gpu, nvidia_smi_gpus, visible_gpus
from tuner.errors import InputError
from tuner.study.plan.layouts import Layout
from tuner.study.store.storage import JOURNAL
from tuner.traces.source import is_stdin
from tuner.urls import shown_url

ALL = "all"


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
SET_FOR_EACH = ("--gpus", "--n-trials", "--time-budget-s", "--storage", "--layout")


def run_on_gpus(args: argparse.Namespace) -> int:
    """``tuner run --gpus``: the layout (measured first where the study compares several), the
    workers, one a group of GPUs of the layout's size, then the confirmation on the first group;
    the confirmation's exit status (a worker's, where none added its trials)."""
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
    plan = plan_of(args, spec, gpus)
    print(plan.why)
    layout = plan.layout
    if plan.searched:
        phase = measure_layouts(plan, spec, gpus, base, name, storage)
        if phase.failed is not None:
            return phase.failed
        layout = phase.layout
    at = ["--layout", layout.name] if (plan.given or plan.searched) and layout.args else []
    return _search_and_confirm(args, gpus, layout, [*base, *at], n_trials, name, storage, began)


def _search_and_confirm(
    args: argparse.Namespace,
    gpus: Sequence[Gpu],
    layout: Layout,
    base: list[str],
    n_trials: int,
    name: str,
    storage: str,
    began: float,
) -> int:
    """The workers, one a group of ``gpus`` of the layout's size, then the confirmation on the
    first group alone; its exit status (a worker's, where none added its trials)."""
    groups = groups_of(gpus, layout)
    left = gpus[len(groups) * layout.gpus :]
    if left:
        print(f"GPU{'s' if len(left) != 1 else ''} {indices(left)} left out: a server takes "
              f"{layout.gpus}")  # fmt: skip
    dealt = [
        (group, k) for group, k in zip(groups, shares(n_trials, len(groups)), strict=True) if k
    ]
    each = "one per GPU" if layout.gpus == 1 else f"one per {layout.gpus} GPUs ({layout})"
    first = groups[0]
    print(
        f"{len(dealt)} worker{'s' if len(dealt) != 1 else ''}, {each}, {n_trials} trials "
        f"in all, on study {name!r} in "
        f"{shown_url(storage)}; then the confirmation on {_gpus_said(first)}"
    )
    budget = (
        [] if args.time_budget_s is None else ["--time-budget-s", f"{_left_s(args, began):.0f}"]
    )
    workers = [
        Child([*base, "--n-trials", str(k), *budget, "--no-confirm"], group, head_of(group))
        for group, k in dealt
    ]
    for worker in workers:
        names = ", ".join(f"{gpu.name} ({gpu.uuid})" for gpu in worker.gpus)
        print(f"{worker.head}{names}: {worker.said()}")
    codes = run_all(workers)
    failed = [
        f"{_gpus_said(w.gpus)}: {code}"
        for w, code in zip(workers, codes, strict=True)
        if code != EXIT_MEETS_SLOS
    ]
    if EXIT_INTERRUPTED in codes:
        return EXIT_INTERRUPTED
    if workers and len(failed) == len(workers):
        print(f"no worker added its trials (exit status {', '.join(failed)})")
        return codes[0]
    if failed:
        print(f"workers that failed (exit status): {', '.join(failed)}")
    confirm = [*base, "--confirm-only"]
    if args.time_budget_s is not None:
        confirm += ["--time-budget-s", f"{_left_s(args, began):.0f}"]
    child = Child(confirm, first)
    print(f"\nconfirming on {_gpus_said(first)} alone: {child.said()}")
    return run_all([child])[0]


def _gpus_said(gpus: Sequence[Gpu]) -> str:
    return f"GPU{'s' if len(gpus) != 1 else ''} {indices(gpus)}"


def _left_s(args: argparse.Namespace, began: float) -> float:
    """What is left of ``--time-budget-s`` since the run began, at least a second."""
    return max(args.time_budget_s - (time.monotonic() - began), 1.0)
