"""The study spec: one validated, frozen object built from ``studies/NAME.yaml``.

Everything a study needs that is not the trace: the model, fixed engine arguments, the search
space, SLOs, their weights, the number of trials and the replay window.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any

from tuner.engine.dummy_model import SHAPES
from tuner.errors import SpecError
from tuner.flags import (
    SERVER_ONLY,
    flag_name,
    nest,
    normalize,
)
from tuner.load.health import CLIENT_TOLERANCE_S
from tuner.study.plan.own_server import SECTION as SERVER
from tuner.study.plan.own_server import OwnServer, check_first_token_metrics, parse_server
from tuner.study.plan.spec_file import read_spec_document
from tuner.study.plan.spec_values import (
    CHOICE_TYPES,
    LEAST_SCALE,
    MOST_REPEATS,
    MOST_S,
    MOST_SCALE,
    MOST_TRIALS,
    checked_mapping,
    checked_number,
    checked_share,
    checked_whole,
)

LATENCY = "latency"
CAPACITY = "capacity"
GOODPUT = "goodput"
# The names ``objective_mode`` takes; each an objective of ``tuner.study.setup.objective``.
OBJECTIVE_MODES = (LATENCY, CAPACITY, GOODPUT)

# Metrics a spec may name in SLOs and weights: client-side tails, in seconds.
SCORED_METRICS = (
    "ttft_p50_s",
    "ttft_p95_s",
    "ttft_p99_s",
    "tpot_p50_s",
    "tpot_p95_s",
    "tpot_p99_s",
    "e2e_p50_s",
    "e2e_p95_s",
    "e2e_p99_s",
)


@dataclass(frozen=True)
class Dimension:
    """One searched engine argument."""

    name: str
    kind: str  # "int", "float" or "categorical"
    low: float | None = None
    high: float | None = None
    step: float | None = None
    log: bool = False
    choices: tuple[Any, ...] = ()
    # vLLM's own value where the argument is not given (``has_default``: the spec says; a
    # default may be None): where the incumbent search places vLLM's defaults, and starts.
    default: Any = None
    has_default: bool = False


AUTO = "auto"
# Seconds of replay per rate of a capacity search (tuner.study.capacity.probes).
CAPACITY_PROBE_S = 30.0
# The fewest requests a rate of a capacity search is judged on (its window lengthened to hold
# them, at most 4 times its seconds).
CAPACITY_MIN_REQUESTS = 100
# How a study picks configurations after its reference points (tuner.study.trials.incumbent).
INCUMBENT = "incumbent"
TPE = "tpe"
SEARCHES = (INCUMBENT, TPE)


@dataclass(frozen=True)
class StudySpec:
    """A study as its YAML file states it, checked (``parse_spec``): the model and the engine
    arguments every trial shares, what the search varies, the SLOs and weights a trial is judged
    by, and how trials are replayed, measured and confirmed.

    Every field's default here is the default of a spec file (``DEFAULT_SPEC`` is derived from
    them). Engine-argument names are vLLM's, normalised to dashes; no argument appears both in
    ``engine_args`` and ``space``, and none is one tuner sets itself (``SERVER_ONLY``).
    """

    model: str
    engine_args: Mapping[str, Any]
    space: tuple[Dimension, ...]
    slos: Mapping[str, float]
    weights: Mapping[str, float]
    baseline: Mapping[str, Any] = field(default_factory=dict)
    # Configurations measured right after the baseline (e.g. what production runs today), as
    # engine arguments over ``engine_args``; searched ones follow.
    candidates: tuple[Mapping[str, Any], ...] = ()
    # Whether the spec names a baseline of its own (the configuration a team serves today, say):
    # trial 0 is then not vLLM's defaults, whatever this machine adds to it to start
    # (``tuner.study.plan.space.runnable_baseline``).
    names_baseline: bool = False
    # The candidate the spec gives as ``{}``, vLLM's defaults (``tuner init --current`` makes
    # one beside your configuration), by its index; None where none is.
    defaults_candidate: int | None = None
    n_trials: int = 20
    window_s: float = 60.0
    # A factor on the trace's arrival times, or "auto": the window replayed at
    # ``calibrate_load`` times the rate vLLM's defaults carry on this machine, for at most
    # ``calibrate_replay_s`` seconds (tuner.study.setup.calibrate; latency studies).
    time_scale: float | str = 1.0
    calibrate_load: float = 0.5
    calibrate_replay_s: float = 30.0
    seed: int = 0
    max_error_rate: float = 0.0
    health_timeout_s: float = 900.0
    warmup_requests: int = 0
    dummy_model: str | None = None
    prune_factor: float = 3.0
    prune_after_s: float = 10.0
    # "latency" (minimize the score at the window's rate), "capacity" (maximize the highest
    # rate that meets every SLO; tuner.study.capacity.probes) or "goodput" (the highest rate at
    # which ``goodput_share`` of the requests meet every SLO), and how the rate search runs.
    objective_mode: str = LATENCY
    capacity_probe_s: float = CAPACITY_PROBE_S
    capacity_resolution: float = 0.1
    capacity_max_probes: int = 10
    capacity_min_requests: int = CAPACITY_MIN_REQUESTS
    # "goodput": the share of a rate's requests that must meet every SLO, each on its own
    # TTFT, TPOT and end-to-end time (tuner.study.measure.judge.met_share), above 0, at most 1.
    goodput_share: float = 0.9
    # Before a winner is named: the search's finalist and the baseline measured on this many
    # fresh engines each, in ABBA order (tuner.study.trials.confirm; 3 is the fewest for a
    # verdict at 1/20); 0 for either turns the confirmation off (then nothing searched is
    # written where the baseline meets the SLOs). ``confirm_top_k`` is 0 or 1: one finalist.
    confirm_top_k: int = 1
    confirm_repeats: int = 3
    # The spec's candidates (a hand-tuned configuration) re-measured with them, for the verdict.
    confirm_candidates: bool = False
    # Before each measured replay, vLLM's prefix cache primed with the shared prompt blocks the
    # trace sent before its window (tuner.load.priming); false: every replay starts cold.
    warm_prefix_cache: bool = True
    # ``tuner run --gpus``: before the search, a capacity or goodput study measures vLLM's
    # defaults at each layout (tensor-parallel-size x data-parallel-size) the model fits on the
    # GPUs given, and searches on the one with the most req/s per GPU
    # (tuner.study.plan.layouts); false: the smallest layout that fits.
    search_layout: bool = True
    # "incumbent": from vLLM's defaults, one dimension at a time, moving with the best so far
    # (tuner.study.trials.incumbent), TPE once it has nothing left to propose; "tpe": TPE
    # throughout.
    search: str = INCUMBENT
    # Client processes the replay is spread over ("auto": as many as the window's peak needs,
    # tuner.load.spread.procs_for), and how far behind tuner's client may fall before a window's
    # figures are not used to rank (tuner.load.health).
    client_procs: int | str = AUTO
    client_tolerance_s: float = CLIENT_TOLERANCE_S
    # A stream silent this long (no byte from the server) fails its request: a server that
    # stops answering mid-window costs its trial at most this much more.
    stall_timeout_s: float = 300.0
    # A trial's lease (tuner.study.trials.lease): renewed every third of this while it is
    # measured; a RUNNING trial whose lease ran out is failed by any worker on any host.
    lease_s: float = 120.0
    # Seconds the whole run may take, calibration included: no trial or re-measurement starts
    # that would end after it (going by the longest trial so far); the baseline always runs.
    # ``tuner run --time-budget-s`` overrides it; None: no limit.
    time_budget_s: float | None = None
    # The user's own app around vLLM's AsyncLLM, started per trial in place of vLLM's OpenAI
    # server (tuner.study.plan.own_server); None: vLLM's OpenAI server.
    server: OwnServer | None = None

    @property
    def vllm_defaults(self) -> dict[str, Any]:
        """vLLM's own values of the searched engine arguments, where the spec gives them
        (a dimension's ``default``)."""
        return {d.name: d.default for d in self.space if d.has_default}


DEFAULT_SPEC: dict[str, Any] = {
    "model": "models/cpu-demo",
    "dummy_model": "cpu-demo",
    "engine_args": {},
    "baseline": {},
    "candidates": [],
    # The defaults are vLLM's own on its CPU build (vllm/engine/arg_utils.py,
    # EngineArgs.get_batch_defaults, for the API server): 128 sequences, 2048 batched tokens.
    "search_space": {
        "max-num-seqs": {"type": "int", "low": 1, "high": 32, "default": 128},
        "max-num-batched-tokens": {
            "type": "int",
            "low": 512,
            "high": 16384,
            "log": True,
            "default": 2048,
        },
        "gpu-memory-utilization": {"type": "float", "low": 0.3, "high": 0.95, "step": 0.05},
    },
    "slos": {"ttft_p95_s": 2.0, "tpot_p95_s": 0.2, "e2e_p99_s": 60.0},
    "weights": {"ttft_p95_s": 1.0, "tpot_p95_s": 1.0, "e2e_p99_s": 1.0},
    # Every other key: StudySpec's own default, in its order.
    **{
        f.name: f.default
        for f in fields(StudySpec)
        if f.default is not MISSING and f.name not in ("dummy_model", "candidates")
    },
}

# The SLO weights' earlier key, a word that names the study's mode (``objective_mode``,
# ``--objective``) too: a spec that gives it is read as before.
EARLIER_WEIGHTS = "objective"
# A capacity probe's settings under their earlier names: a spec that gives them is read as before.
EARLIER_NAMES = {
    "capacity_window_s": "capacity_probe_s",
    "capacity_max_windows": "capacity_max_probes",
}
_TOP_LEVEL = set(DEFAULT_SPEC) | {EARLIER_WEIGHTS} | set(EARLIER_NAMES)


def _dimension(path: str, raw_name: str, raw: Any) -> Dimension:
    name = flag_name(raw_name)
    where = f"search_space.{raw_name}"
    raw = checked_mapping(path, where, raw)
    kind = raw.get("type")
    unknown = set(raw) - {"type", "low", "high", "step", "log", "choices", "default"}
    if unknown:
        raise SpecError(path, f"{where}.{sorted(unknown)[0]}", "unknown key")
    has_default = "default" in raw
    default = raw.get("default")
    if kind == "categorical":
        choices = raw.get("choices")
        if not isinstance(choices, list) or not choices:
            raise SpecError(path, f"{where}.choices", "must be a non-empty list")
        odd = [c for c in choices if not isinstance(c, CHOICE_TYPES)]
        if odd or any(isinstance(c, float) and not math.isfinite(c) for c in choices):
            raise SpecError(path, f"{where}.choices", "must be numbers, strings, booleans or null")
        if has_default and default not in choices:
            raise SpecError(path, f"{where}.default", f"{default!r} is not one of the choices")
        return Dimension(
            name, kind, choices=tuple(choices), default=default, has_default=has_default
        )
    if kind not in ("int", "float"):
        raise SpecError(path, f"{where}.type", f"must be int, float or categorical, got {kind!r}")
    if "low" not in raw or "high" not in raw:
        raise SpecError(path, where, "needs low and high")
    low = checked_number(path, f"{where}.low", raw["low"], positive=False)
    high = checked_number(path, f"{where}.high", raw["high"], positive=False)
    if low > high:
        raise SpecError(path, f"{where}.low", f"{low:g} is above high {high:g}")
    step = raw.get("step")
    if step is not None:
        step = checked_number(path, f"{where}.step", step)
    log = raw.get("log", False)
    if not isinstance(log, bool):
        raise SpecError(path, f"{where}.log", "must be true or false")
    if log and (low <= 0 or step not in (None, 1)):
        raise SpecError(path, f"{where}.log", "needs low > 0 and no step")
    if kind == "int" and not all(float(v).is_integer() for v in (low, high, step or 1)):
        raise SpecError(path, where, "an int dimension needs whole low, high and step")
    if has_default:
        # vLLM's value, which may lie outside the searched range (the search starts at the
        # nearest level).
        default = checked_number(path, f"{where}.default", default, positive=False)
        default = int(default) if kind == "int" and default.is_integer() else default
    return Dimension(name, kind, low, high, step, log, default=default, has_default=has_default)


# Settings in seconds: positive, at most MOST_S.
_SECONDS = (
    "window_s",
    "calibrate_replay_s",
    "health_timeout_s",
    "capacity_probe_s",
    "client_tolerance_s",
    "stall_timeout_s",
    "lease_s",
)


def parse_spec(data: Any, path: str = "<spec>") -> StudySpec:
    """Validate a loaded YAML document; an error names the field."""
    data = _renamed(path, checked_mapping(path, "<top level>", data))
    unknown = set(data) - _TOP_LEVEL
    if unknown:
        raise SpecError(
            path, sorted(unknown)[0], f"unknown field; known: {sorted(set(DEFAULT_SPEC))}"
        )
    merged = {**DEFAULT_SPEC, **data}
    model = merged["model"]
    if not isinstance(model, str) or not model:
        raise SpecError(path, "model", "must be a model name or folder")
    engine_args, baseline, candidates, space = _arguments(path, merged)
    slos = _metric_map(path, "slos", merged["slos"])
    weights = _weights(path, data, slos)
    server = parse_server(path, merged[SERVER])
    check_first_token_metrics(path, server, slos, weights)
    # A stand-in only where the spec names one: never in place of the user's model.
    dummy_model = data.get("dummy_model")
    if dummy_model is not None and (not isinstance(dummy_model, str) or dummy_model not in SHAPES):
        raise SpecError(
            path, "dummy_model", f"unknown shape {dummy_model!r}; known: {list(SHAPES)}"
        )
    seconds: dict[str, Any] = {
        key: checked_number(path, key, merged[key], most=MOST_S) for key in _SECONDS
    }
    budget = merged["time_budget_s"]
    seconds["time_budget_s"] = (
        None if budget is None else checked_number(path, "time_budget_s", budget, most=MOST_S)
    )
    return StudySpec(
        model=model,
        engine_args=engine_args,
        space=space,
        slos=slos,
        weights=weights,
        baseline=baseline,
        candidates=candidates,
        names_baseline=bool(baseline),
        defaults_candidate=next((i for i, c in enumerate(candidates) if not c), None),
        dummy_model=dummy_model,
        server=server,
        **seconds,
        **_settings(path, merged),
    )


def _arguments(
    path: str, merged: Mapping[str, Any]
) -> tuple[dict[str, Any], dict[str, Any], tuple[dict[str, Any], ...], tuple[Dimension, ...]]:
    """The spec's engine arguments, baseline, candidates and search space, checked together: no
    argument tuner sets itself, none both fixed and searched, and each nests as vLLM reads it."""
    try:
        engine_args = normalize(checked_mapping(path, "engine_args", merged["engine_args"]))
        baseline = normalize(checked_mapping(path, "baseline", merged["baseline"]))
    except ValueError as exc:
        raise SpecError(path, "engine_args", str(exc)) from None
    candidates = _candidates(path, merged["candidates"], own_baseline=bool(baseline))
    space_raw = checked_mapping(path, "search_space", merged["search_space"])
    space = tuple(_dimension(path, name, raw) for name, raw in space_raw.items())
    names = [d.name for d in space]
    candidate_names = {name for candidate in candidates for name in candidate}
    for name in set(names) | set(engine_args) | set(baseline) | candidate_names:
        if name.partition(".")[0] in (*SERVER_ONLY, "model"):
            raise SpecError(path, name, "is set by tuner, not by the spec")
    if len(set(names)) != len(names):
        raise SpecError(path, "search_space", "an argument appears twice")
    both = set(names) & set(engine_args)
    if both:
        raise SpecError(path, f"engine_args.{sorted(both)[0]}", "is also in search_space")
    try:
        nest({**engine_args, **{name: 0 for name in names}})
    except ValueError as exc:
        raise SpecError(path, "search_space", str(exc)) from None
    return engine_args, baseline, candidates, space


def _settings(path: str, merged: Mapping[str, Any]) -> dict[str, Any]:
    """The spec's other settings (how the study runs, measures and confirms), checked."""
    mode = merged["objective_mode"]
    if mode not in OBJECTIVE_MODES:
        raise SpecError(path, "objective_mode", f"must be one of {OBJECTIVE_MODES}, got {mode!r}")
    max_error_rate = checked_number(
        path, "max_error_rate", merged["max_error_rate"], positive=False
    )
    if not 0 <= max_error_rate <= 1:
        raise SpecError(path, "max_error_rate", "must be between 0 and 1")
    for flag in ("confirm_candidates", "warm_prefix_cache", "search_layout"):
        if not isinstance(merged[flag], bool):
            raise SpecError(path, flag, "must be true or false")
    if merged["search"] not in SEARCHES:
        raise SpecError(path, "search", f"must be one of {SEARCHES}, got {merged['search']!r}")
    client_procs = merged["client_procs"]
    if client_procs != AUTO:
        client_procs = checked_whole(path, "client_procs", client_procs, 1, 1024)
    time_scale = _time_scale(path, merged["time_scale"])
    return {
        "objective_mode": mode,
        "max_error_rate": max_error_rate,
        "n_trials": checked_whole(path, "n_trials", merged["n_trials"], 1, MOST_TRIALS),
        "warmup_requests": checked_whole(
            path, "warmup_requests", merged["warmup_requests"], 0, 10**6
        ),
        "seed": checked_whole(path, "seed", merged["seed"], -(2**31), 2**31 - 1),
        "time_scale": time_scale,
        "calibrate_load": checked_share(path, "calibrate_load", merged["calibrate_load"]),
        "prune_factor": checked_number(
            path, "prune_factor", merged["prune_factor"], positive=False
        ),
        "prune_after_s": checked_number(
            path, "prune_after_s", merged["prune_after_s"], positive=False, most=MOST_S
        ),
        "capacity_resolution": checked_number(
            path, "capacity_resolution", merged["capacity_resolution"], most=1.0
        ),
        "capacity_max_probes": checked_whole(
            path, "capacity_max_probes", merged["capacity_max_probes"], 2, 1000
        ),
        "goodput_share": checked_share(path, "goodput_share", merged["goodput_share"]),
        "capacity_min_requests": checked_whole(
            path, "capacity_min_requests", merged["capacity_min_requests"], 1, 10**6
        ),
        "client_procs": client_procs,
        "confirm_top_k": checked_whole(path, "confirm_top_k", merged["confirm_top_k"], 0, 1),
        "confirm_repeats": checked_whole(
            path, "confirm_repeats", merged["confirm_repeats"], 0, MOST_REPEATS
        ),
        "confirm_candidates": merged["confirm_candidates"],
        "warm_prefix_cache": merged["warm_prefix_cache"],
        "search_layout": merged["search_layout"],
        "search": merged["search"],
    }


def _time_scale(path: str, value: Any) -> Any:
    """``auto``, or a time scale within the bounds of sense."""
    if value == AUTO:
        return value
    scale = checked_number(path, "time_scale", value, most=MOST_SCALE)
    if scale < LEAST_SCALE:
        raise SpecError(
            path, "time_scale", f"{scale!r} is below any sensible value (at least {LEAST_SCALE:g})"
        )
    return scale


def _candidates(path: str, value: Any, own_baseline: bool) -> tuple[dict[str, Any], ...]:
    """The spec's candidates; ``{}`` (vLLM's defaults) only beside a baseline of the spec's own,
    and once."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise SpecError(path, "candidates", "must be a list of engine-argument mappings")
    out = []
    for i, raw in enumerate(value):
        try:
            candidate = normalize(checked_mapping(path, f"candidates[{i}]", raw))
        except ValueError as exc:
            raise SpecError(path, f"candidates[{i}]", str(exc)) from None
        if not candidate and (not own_baseline or {} in out):
            why = "vLLM's defaults twice" if own_baseline else "vLLM's defaults, the baseline"
            raise SpecError(path, f"candidates[{i}]", f"sets no engine argument: {why} already")
        out.append(candidate)
    return tuple(out)


def _renamed(path: str, data: Mapping[str, Any]) -> dict[str, Any]:
    """``data`` with each setting given under its earlier name (``EARLIER_NAMES``) under its
    name; an error where a spec gives both."""
    out = dict(data)
    for earlier, name in EARLIER_NAMES.items():
        if earlier in out:
            if name in out:
                raise SpecError(path, earlier, f"the earlier name of {name}: give one of them")
            out[name] = out.pop(earlier)
    return out


def _weights(path: str, data: Mapping[str, Any], slos: Mapping[str, float]) -> dict[str, float]:
    """The SLO weights, under ``weights`` or their earlier key (``EARLIER_WEIGHTS``), not both;
    an error names the key as the spec gives it."""
    key = EARLIER_WEIGHTS if EARLIER_WEIGHTS in data else "weights"
    if key == EARLIER_WEIGHTS and "weights" in data:
        raise SpecError(path, key, "the earlier name of weights: give one of them")
    weights = _metric_map(path, key, data.get(key, DEFAULT_SPEC["weights"]), allow_zero=True)
    missing = set(weights) - set(slos)
    if missing:
        raise SpecError(path, f"{key}.{sorted(missing)[0]}", "has a weight but no SLO")
    return weights


def _metric_map(path: str, name: str, value: Any, *, allow_zero: bool = False) -> dict[str, float]:
    raw = checked_mapping(path, name, value)
    out = {}
    for metric, limit in raw.items():
        if metric not in SCORED_METRICS:
            raise SpecError(path, f"{name}.{metric}", f"unknown metric; known: {SCORED_METRICS}")
        out[metric] = checked_number(
            path, f"{name}.{metric}", limit, positive=not allow_zero, most=MOST_S
        )
        if out[metric] < 0:
            raise SpecError(path, f"{name}.{metric}", "must not be negative")
    if not out:
        raise SpecError(path, name, "must name at least one metric")
    return out


def load_spec(path: str | Path) -> StudySpec:
    """Read and check the spec file at ``path``; ``SpecError`` names the field at fault."""
    return parse_spec(read_spec_document(Path(path)), str(path))
