"""``tuner run --gpus``'s layout phase: which layout each worker's server runs at, measured
first where the study compares several (``tuner.study.plan.layouts``).

The plan is said in one line. Where it measures layouts, each layout's trial (vLLM's defaults,
the baseline, at that layout) runs as a ``tuner run --layout TxD --n-trials 1 --no-confirm`` of
its own on the first t·d of the GPUs given, one after another, on the study the workers share
(its lines after ``layout TxD |``); a layout the study measured already is not measured again.
The layout whose server carries the most req/s per GPU is then kept in the study
(``tuner.study.trials.layout_phase.choose``), each layout's figures said, and the GPUs are
split into groups of its size, one worker a group.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass

from tuner.cli.children import Child, indices, run_all
from tuner.cli.exits import EXIT_INTERRUPTED, EXIT_MEETS_SLOS
from tuner.engine.dummy_model import SHAPES, model_config
from tuner.engine.environment import Gpu
from tuner.engine.model_size import ModelSize, model_size, size_of_config
from tuner.errors import InputError
from tuner.study.plan.layouts import Layout, LayoutPlan, plan_layouts
from tuner.study.plan.spec import StudySpec
from tuner.study.setup.objective import of_spec
from tuner.study.trials import layout_phase, search

# The engine argument that loads a model quantized on the fly: its weights are then fewer bytes
# than its files or its config say, which tuner does not estimate.
QUANTIZATION = "quantization"


def size_of(spec: StudySpec) -> ModelSize | None:
    """The weights of the spec's model as its engine arguments load them (``model_size``; the
    shape of its ``dummy_model`` where that is not written yet); None where unknown, or where the
    spec quantizes on load."""
    args = spec.engine_args
    if QUANTIZATION in args:
        return None
    dtype = args.get("dtype") if isinstance(args.get("dtype"), str) else None
    revision = args.get("revision") if isinstance(args.get("revision"), str) else None
    found = model_size(spec.model, dtype, revision)
    if found is None and spec.dummy_model in SHAPES:
        found = size_of_config(model_config(SHAPES[spec.dummy_model]), dtype)
    return found


def plan_of(args: argparse.Namespace, spec: StudySpec, gpus: Sequence[Gpu]) -> LayoutPlan:
    """The run's plan: ``--layout`` where given, else ``plan_layouts``'s; an ``InputError``
    where the model fits on none of the GPUs, or a server takes more GPUs than are given."""
    given: Layout | None = getattr(args, "layout", None)
    if given is not None:
        plan = LayoutPlan((given,), False, f"layout: {given}, as --layout gives it")
    else:
        try:
            plan = plan_layouts(spec, gpus, size_of(spec), of_spec(spec).searches_rates)
        except ValueError as exc:
            raise InputError(f"--gpus: {exc}") from None
    if plan.layout.gpus > len(gpus):
        raise InputError(
            f"--gpus {args.gpus}: {plan.why}: a server takes {plan.layout.gpus} GPUs, more than "
            f"the {len(gpus)} given"
        )
    return plan


@dataclass(frozen=True)
class Phase:
    """How the layout phase ended: the layout kept, or the exit status of a layout trial's run
    that failed or was interrupted (``failed``: then no worker starts)."""

    layout: Layout
    failed: int | None = None


def measure_layouts(
    plan: LayoutPlan,
    spec: StudySpec,
    gpus: Sequence[Gpu],
    base: Sequence[str],
    name: str,
    storage: str,
) -> Phase:
    """Each of the plan's layouts measured (those the study has not) on the first of ``gpus``,
    one after another, by the ``tuner run`` of ``base``; the layout kept, said with each
    layout's figures. A study that kept a layout already keeps it."""
    study = search.open_study(
        name, storage, spec.seed, search.pruner_for(spec), objective=of_spec(spec)
    )
    kept = layout_phase.kept_layout(study)
    if kept is not None:
        print(f"layout: {kept}, which study {name!r} kept from its layout trials")
        return Phase(kept)
    done = layout_phase.layout_trials(study, plan.layouts)
    for layout in plan.layouts:
        if layout in done:
            print(f"layout {layout.name} | measured already: trial {done[layout].number}")
            continue
        on = tuple(gpus[: layout.gpus])
        argv = [*base, "--layout", layout.name, "--n-trials", "1", "--no-confirm"]
        child = Child(argv, on, head=f"layout {layout.name} | ")
        print(f"layout {layout.name} | {layout} on GPU{'s' if len(on) != 1 else ''} "
              f"{indices(on)}: {child.said()}")  # fmt: skip
        (code,) = run_all([child])
        if code != EXIT_MEETS_SLOS:  # a run that adds its trials exits 0 (--no-confirm)
            if code != EXIT_INTERRUPTED:
                print(
                    f"layout {layout.name}: its run failed (exit status {code}); no worker started"
                )
            return Phase(plan.layout, failed=code)
    kept, lines = layout_phase.choose(study, plan.layouts, spec.capacity_resolution)
    print("\n".join(["the layouts measured, each its server's capacity:", *lines]))
    return Phase(kept)


def groups_of(gpus: Sequence[Gpu], layout: Layout) -> list[tuple[Gpu, ...]]:
    """``gpus`` in groups of the layout's size, in their order: one server, and one worker, a
    group; those left over make no group."""
    size = layout.gpus
    return [tuple(gpus[i : i + size]) for i in range(0, len(gpus) - size + 1, size)]
