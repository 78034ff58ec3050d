"""How one server spreads over GPUs (its layout), and the layouts a study measures first.

A layout is vLLM's ``tensor-parallel-size`` t (each layer split over t GPUs) and
``data-parallel-size`` d (d copies of the model behind the one server): one server on t·d GPUs,
``vllm serve --tensor-parallel-size t --data-parallel-size d``.

``fitting_layouts`` lists the layouts worth measuring on G GPUs from the model's weight bytes
and each GPU's memory: the smallest power of two t whose share of the weights leaves room for a
KV cache (``WEIGHTS_SHARE_OF_GPU``), and 2t where that is at most G, each as one copy (d = 1)
and as many copies as the GPUs hold (d = G / t): at most ``MOST_LAYOUTS``. ``plan_layouts``
says what a study does with them (the spec may pin a layout, search one itself, or turn the
layout search off), and ``pick_layout`` which of the measured ones a study keeps: the most
req/s per GPU within the SLOs, so that two servers of one GPU and one server of two are
compared on the same GPUs. Pure: the GPUs and the model's size are given.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tuner.engine.environment import Gpu
from tuner.engine.model_size import ModelSize
from tuner.flags import DATA_PARALLEL, TENSOR_PARALLEL
from tuner.study.plan.spec import StudySpec

LAYOUT_ARGUMENTS = (TENSOR_PARALLEL, DATA_PARALLEL)
# The most of one GPU's memory its share of the weights (the weights over t) may take: the
# rest, under vLLM's gpu-memory-utilization of 0.9, holds the KV cache, the activations and
# the CUDA graphs. Not measured: a rule of thumb, checked by the layout's own trial (a layout
# whose server does not start is an infeasible trial, never the study's).
WEIGHTS_SHARE_OF_GPU = 0.8
# The most layouts measured before the search: each costs a trial on up to every GPU.
MOST_LAYOUTS = 4
# Layouts whose rates per GPU are within this many capacity resolutions of the best are a tie
# (``pick_layout``): each capacity is bracketed to within one resolution, so two measurements of
# equal servers differ by up to about two (a configuration measured twice on one H100 differed
# by 10 to 20 %: tuner.study.trials.groups).
TIE_RESOLUTIONS = 2
MIB = 1 << 20


@dataclass(frozen=True)
class Layout:
    """One server's layout: ``tensor_parallel`` GPUs a copy of the model, ``data_parallel``
    copies; ``gpus`` in all."""

    tensor_parallel: int = 1
    data_parallel: int = 1

    @property
    def gpus(self) -> int:
        return self.tensor_parallel * self.data_parallel

    @property
    def args(self) -> dict[str, int]:
        """Its engine arguments, those other than 1 (vLLM's default) only."""
        given = {TENSOR_PARALLEL: self.tensor_parallel, DATA_PARALLEL: self.data_parallel}
        return {name: value for name, value in given.items() if value != 1}

    @property
    def name(self) -> str:
        """``TxD``: as ``tuner run --layout`` takes it, and a trial records it."""
        return f"{self.tensor_parallel}x{self.data_parallel}"

    def __str__(self) -> str:
        """``2 GPUs: tensor-parallel-size 2``; ``1 GPU`` for vLLM's default layout."""
        gpus = f"{self.gpus} GPU{'s' if self.gpus != 1 else ''}"
        args = ", ".join(f"{name} {value}" for name, value in self.args.items())
        return f"{gpus}: {args}" if args else gpus

    @classmethod
    def parse(cls, text: str) -> Layout:
        """``TxD`` (``2x1``) or ``T``; a ``ValueError`` for anything else."""
        tensor, x, data = text.strip().lower().partition("x")
        if not tensor.isdigit() or not (data if x else "1").isdigit():
            raise ValueError(f"a layout is TxD (tensor-parallel-size x data-parallel-size, 2x1), "
                             f"not {text!r}")  # fmt: skip
        layout = cls(int(tensor), int(data if x else 1))
        if layout.tensor_parallel < 1 or layout.data_parallel < 1:
            raise ValueError(f"a layout's sizes are at least 1, not {text!r}")
        return layout


def layout_of(args: Mapping[str, Any]) -> Layout:
    """The layout engine arguments ask for (vLLM's default, 1, for each not given)."""
    return Layout(_size(args.get(TENSOR_PARALLEL)), _size(args.get(DATA_PARALLEL)))


def _size(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):
        return 1
    try:
        return max(1, int(value))
    except ValueError:
        return 1


def smallest_tensor_parallel(
    weight_bytes: int | None, memory_bytes: int | None, gpus: int, heads: int | None = None
) -> int | None:
    """The smallest power of two t (at most ``gpus``, dividing ``heads`` where known) whose share
    of the weights is at most ``WEIGHTS_SHARE_OF_GPU`` of a GPU's memory; 1 where the weights
    or the memory are unknown; None where no t on ``gpus`` GPUs holds them."""
    if weight_bytes is None or memory_bytes is None:
        return 1
    tensor = 1
    while tensor <= gpus:
        divides = heads is None or heads % tensor == 0
        if divides and weight_bytes / tensor <= WEIGHTS_SHARE_OF_GPU * memory_bytes:
            return tensor
        tensor *= 2
    return None


def fitting_layouts(
    weight_bytes: int | None, memory_bytes: int | None, gpus: int, heads: int | None = None
) -> list[Layout]:
    """The layouts worth measuring on ``gpus`` GPUs of ``memory_bytes`` each for weights of
    ``weight_bytes``: the smallest t that holds them (``smallest_tensor_parallel``) and 2t
    where that is at most ``gpus``, each as one copy and as ``gpus // t`` copies; the smallest
    first, at most ``MOST_LAYOUTS``. Empty where the weights fit on no t of these GPUs."""
    smallest = smallest_tensor_parallel(weight_bytes, memory_bytes, gpus, heads)
    if smallest is None:
        return []
    tensors = [smallest]
    if 2 * smallest <= gpus and (heads is None or heads % (2 * smallest) == 0):
        tensors.append(2 * smallest)
    found: list[Layout] = []
    for tensor in tensors:
        for layout in (Layout(tensor, 1), Layout(tensor, gpus // tensor)):
            if layout not in found:
                found.append(layout)
    return found[:MOST_LAYOUTS]


@dataclass(frozen=True)
class LayoutPlan:
    """What a study does with layouts on its GPUs: ``layouts`` measured one after another
    before the search where ``searched`` (the smallest first), else the one layout every trial
    runs (``layouts[0]``); ``why``, said before; ``given``: whether the workers are told the
    layout (``tuner run --layout``), false where the spec's engine arguments set it already."""

    layouts: tuple[Layout, ...]
    searched: bool
    why: str
    given: bool = True

    @property
    def layout(self) -> Layout:
        """The layout of a plan that searches none; the first measured of one that does."""
        return self.layouts[0]


def plan_layouts(
    spec: StudySpec, gpus: Sequence[Gpu], size: ModelSize | None, searches_rates: bool
) -> LayoutPlan:
    """The ``spec``'s plan on ``gpus`` for a model of ``size`` (None: unknown). A layout the
    spec sets (in ``engine_args`` or its baseline) or searches itself (``search_space``) is
    kept; else the layouts that fit (``fitting_layouts``) are measured where the objective
    ``searches_rates`` (a rate per GPU compares layouts; latency at the trace's own rate does
    not) and the spec's ``search_layout`` is on, and there are two or more; else the smallest.
    A ``ValueError`` where the weights fit on none of these GPUs."""
    fixed = dict(spec.engine_args)
    pinned = layout_of({**fixed, **spec.baseline})
    if any(name in {**fixed, **spec.baseline} for name in LAYOUT_ARGUMENTS):
        given = pinned.args != layout_of(fixed).args
        return LayoutPlan((pinned,), False, f"layout: {pinned}, as the spec sets it", given)
    searched = [d for d in spec.space if d.name in LAYOUT_ARGUMENTS]
    if searched:
        largest = layout_of({d.name: max(_values(d.choices, d.high)) for d in searched})
        why = f"layout: the spec searches {', '.join(d.name for d in searched)}: {largest} a worker"
        return LayoutPlan((largest,), False, why, given=False)
    memory = _least_memory(gpus)
    weights = None if size is None else size.weight_bytes
    heads = None if size is None else size.attention_heads
    fits = fitting_layouts(weights, memory, len(gpus), heads)
    if not fits:
        assert size is not None and memory is not None
        raise ValueError(
            f"the model's weights, {_gib(size.weight_bytes)} ({size.how}), fit on no layout of "
            f"these {len(gpus)} GPUs of {_gib(memory)}: a server's share of them is at most "
            f"{WEIGHTS_SHARE_OF_GPU:.0%} of a GPU's memory; give more GPUs, or set "
            f"{TENSOR_PARALLEL} in the spec's engine_args"
        )
    said = _sizes(size, memory)
    if len(fits) == 1:
        return LayoutPlan((fits[0],), False, f"layout: {fits[0]}, the only one that fits{said}")
    if not spec.search_layout:
        why = f"layout: {fits[0]}, the smallest that fits{said}; search_layout is off"
        return LayoutPlan((fits[0],), False, why)
    if not searches_rates:
        why = (
            f"layout: {fits[0]}, the smallest that fits{said}; a {spec.objective_mode} study "
            "measures no other, as latency at the trace's own rate does not compare per GPU"
        )
        return LayoutPlan((fits[0],), False, why)
    shown = "; ".join(str(layout) for layout in fits)
    why = f"layouts measured before the search{said}: {shown}"
    return LayoutPlan(tuple(fits), True, why)


def _values(choices: Sequence[Any], high: float | None) -> list[int]:
    values = [_size(v) for v in choices] if choices else [_size(int(high or 1))]
    return values or [1]


def _least_memory(gpus: Sequence[Gpu]) -> int | None:
    """The memory of the smallest GPU given, in bytes; None where nvidia-smi gave none."""
    memories = [g.memory_mib for g in gpus]
    if not memories or any(m is None for m in memories):
        return None
    return min(m for m in memories if m is not None) * MIB


def _gib(n_bytes: int) -> str:
    return f"{n_bytes / (1 << 30):.1f} GiB"


def _sizes(size: ModelSize | None, memory: int | None) -> str:
    """`` (the model's weights 14.2 GiB, from ...; each GPU 140 GiB)``, or what is unknown."""
    weights = "unknown" if size is None else f"{_gib(size.weight_bytes)} ({size.how})"
    gpu = "unknown" if memory is None else _gib(memory)
    return f" (the model's weights {weights}; each GPU's memory {gpu})"


def tie_share(resolution: float) -> float:
    """How far below the best rate per GPU a layout is not told apart from it (``pick_layout``),
    as a share of the best: ``TIE_RESOLUTIONS`` capacity resolutions, less than the whole."""
    return min(TIE_RESOLUTIONS * resolution, 0.5)


def per_gpu(capacity_req_per_s: float, layout: Layout) -> float:
    """A server's rate per GPU of its layout."""
    return capacity_req_per_s / layout.gpus


def pick_layout(
    measured: Sequence[tuple[Layout, float | None]], resolution: float
) -> Layout | None:
    """The layout whose server carries the most req/s per GPU within the SLOs, of ``measured``
    (each layout with its server's capacity, None or 0 where it met no rate). The search brackets
    each capacity to within ``resolution`` below the rate it failed at, so two servers that
    carry the same per GPU can be measured ``resolution`` apart each way: rates per GPU within
    ``TIE_RESOLUTIONS`` resolutions of the best are not told apart, and of those the fewest GPUs
    a server wins (more workers for the search, servers added in smaller steps), then the first
    measured. None where none met a rate."""
    served = [(layout, per_gpu(c, layout)) for layout, c in measured if c is not None and c > 0]
    if not served:
        return None
    best = max(rate for _, rate in served)
    close = [layout for layout, rate in served if rate >= best * (1 - tie_share(resolution))]
    return min(close, key=lambda layout: (layout.gpus, close.index(layout)))
