"""The layout a study searches on: its layout trials, the one kept, and the trials of it.

Before the search of a ``tuner run --gpus`` study, vLLM's defaults (the baseline) are measured
at each layout worth measuring (``tuner.study.plan.layouts``), each a trial of the study on its
own GPUs; the layout whose server carries the most req/s per GPU is then kept as a study
attribute (``LAYOUT_KEPT``), and every later trial runs at it. From then on the study ranks,
gates, proposes and confirms among the trials of that layout only (``of_kept_layout``): a
server of four GPUs that carries more req/s than one of a single GPU is not a better
configuration of the one-GPU server, and the layout's pick has already compared them per GPU.
A study that kept no layout ranks all its trials, as before.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from tuner.errors import InputError
from tuner.study.plan.layouts import Layout, layout_of, per_gpu, pick_layout, tie_share
from tuner.study.store.record import Queued, TrialRecord
from tuner.study.trials.references import layout_name

# The study attribute that holds the layout kept, and the trials it was chosen from.
LAYOUT_KEPT = "layout"


def layout_of_trial(trial: FrozenTrial) -> Layout:
    """The layout a trial ran at: its engine arguments', or, before it recorded them (a queued
    trial), the one it was queued at."""
    recorded = TrialRecord.of(trial)
    if recorded.engine_args:
        return layout_of(recorded.engine_args)
    queued = Queued.of(trial).layout
    try:
        return Layout() if queued is None else Layout.parse(queued)
    except ValueError:  # not a layout tuner wrote
        return Layout()


def kept_layout(study: optuna.Study) -> Layout | None:
    """The layout the study keeps (``keep``), None where it kept none."""
    kept = study.user_attrs.get(LAYOUT_KEPT)
    if not isinstance(kept, Mapping):
        return None
    return layout_of(kept)


def keep(study: optuna.Study, layout: Layout, trials: Sequence[int]) -> None:
    """Keep ``layout`` as the study's, picked from the layout trials ``trials``."""
    study.set_user_attr(LAYOUT_KEPT, {**layout.args, "name": layout.name, "from": list(trials)})


def of_kept_layout(study: optuna.Study, trials: Iterable[FrozenTrial]) -> list[FrozenTrial]:
    """``trials`` at the study's kept layout; all of them where it keeps none."""
    kept = kept_layout(study)
    if kept is None:
        return list(trials)
    return [t for t in trials if layout_of_trial(t) == kept]


def run_layout(
    study: optuna.Study, given: Layout | None, fixed: Mapping[str, Any]
) -> Layout | None:
    """The layout a run measures at: ``given`` (``tuner run --layout``), else the study's kept
    one; None for vLLM's default. An ``InputError`` where ``given`` is not the layout the study
    keeps, or the spec's engine arguments (``fixed``) set another."""
    kept = kept_layout(study)
    if given is not None and kept is not None and given != kept:
        raise InputError(
            f"--layout {given.name}: study {study.study_name!r} searches at {kept.name} ({kept}), "
            "the layout it kept from its layout trials; run at that one, or use --study NEWNAME"
        )
    layout = given if given is not None else kept
    if layout is not None and any(k in fixed for k in layout.args) and layout != layout_of(fixed):
        raise InputError(
            f"--layout {layout.name}: the spec's engine_args set {layout_of(fixed)}; give one of "
            "them"
        )
    return layout


def layout_trials(study: optuna.Study, layouts: Sequence[Layout]) -> dict[Layout, FrozenTrial]:
    """The completed baseline trial at each of ``layouts`` that has one (its first)."""
    found: dict[Layout, FrozenTrial] = {}
    for trial in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        queued = Queued.of(trial)
        if not queued.baseline or queued.confirms is not None:
            continue
        for layout in layouts:
            if queued.layout == layout_name(layout) and layout not in found:
                found[layout] = trial
    return found


def measured(trials: Mapping[Layout, FrozenTrial]) -> list[tuple[Layout, float | None]]:
    """Each layout with its server's capacity, None where its trial met no rate or the SLOs."""
    out: list[tuple[Layout, float | None]] = []
    for layout, trial in trials.items():
        recorded = TrialRecord.of(trial)
        out.append((layout, recorded.capacity_req_per_s if recorded.feasible else None))
    return out


def choose(
    study: optuna.Study, layouts: Sequence[Layout], resolution: float
) -> tuple[Layout, list[str]]:
    """The layout the study searches on, kept (``keep``), and what is said of it: each layout
    trial's capacity per server and per GPU, then the pick (``pick_layout``); where no layout met
    a rate, the smallest, said so."""
    trials = layout_trials(study, layouts)
    rates = measured(trials)
    lines = []
    for layout, capacity in rates:
        number = trials[layout].number
        if capacity is None:
            lines.append(f"  {layout}: trial {number} met the SLOs at no rate")
            continue
        lines.append(
            f"  {layout}: trial {number}, {capacity:.3g} req/s a server, "
            f"{per_gpu(capacity, layout):.3g} per GPU"
        )
    picked = pick_layout(rates, resolution)
    if picked is None:
        picked = layouts[0]
        lines.append(f"layout kept: {picked}, the smallest: no layout met the SLOs at any rate")
    else:
        lines.append(
            f"layout kept: {picked}, the most req/s per GPU within the SLOs (layouts within "
            f"{tie_share(resolution):.0%} of the most per GPU are not told apart: of those, the "
            "fewest GPUs a server)"
        )
    keep(study, picked, [trials[layout].number for layout in trials])
    return picked, lines
