"""The configuration tuner writes, and the trial that stands for it: one choice, read by
``tuner run`` (the YAML it writes and its exit status), ``tuner report`` (the page's verdict) and
the GPU runner's tables, so that they cannot name different winners.

A configuration is its first trial and its re-measurements
(``tuner.study.trials.groups.groups``). The choice has three outcomes:

- ``TUNED``: the search's finalist beats the baseline (vLLM's defaults, or the spec's
  ``baseline``) on fresh engines: in the confirmation's round (``tuner.study.trials.confirm``),
  each of its fresh measurements is better than each of the baseline's, as many of each and at
  least 3 (p = 1/20 at 3 against 3, ``tuner.study.trials.significance``), and the baseline did
  not meet the SLOs at its confirmed capacity. The search's own measurements choose the
  finalist and never count in that test. Written with its fresh measurements against the
  baseline's, the gain with its interval (``tuner run`` exits 0). Only a test writes it.
- ``UNCONFIRMED``: a searched configuration meets the SLOs where the baseline did not (it
  missed them in the search, or its engine failed on both of its starts) and no fresh
  measurement of the baseline tested it (the confirmation off, or stopped by the time budget):
  the searched configuration measured most often that met the SLOs is written, said to be
  unconfirmed (``tuner run`` exits 3, never 0).
- ``DEFAULTS``: the baseline meets the SLOs and the finalist was not confirmed (a fresh pair
  favoured the baseline, the fresh measurements were too few, or nothing else met the SLOs):
  the baseline is written, and the choice names the finalist and why.
- ``MISSES``: no configuration met the SLOs; the closest is written, the served configuration
  with the best median, one whose client kept up where any did. Also where the baseline misses
  the SLOs and fresh measurements did not confirm the finalist, its own fresh engine's failure
  among them: a finalist is never written because its engine failed.

The trial that stands for a configuration is its median measurement (``Group.median_trial``): a
real one, whose engine arguments and figures are written.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from tuner.study.result.words import words_of
from tuner.study.setup.objective import StudyObjective, of_trial
from tuner.study.store.record import VLLM_DEFAULTS, TrialRecord
from tuner.study.trials import confirm, fingerprint, significance
from tuner.study.trials.groups import Group, any_confirms, groups, rank

TUNED = "tuned"
UNCONFIRMED = "unconfirmed"
DEFAULTS = "defaults"
MISSES = "misses"


@dataclass(frozen=True)
class Gain:
    """How much better a confirmed finalist is than the baseline on fresh engines, the figures
    of ``beats_words``: ``fraction`` better by the median (0.5: 50 % better), ``ratio`` times
    better with its ``confidence`` interval from ``low`` to ``high`` (``high`` infinite where
    too few measurements bound it above; the three None where a median measurement missed the
    SLOs or is 0), over ``fresh`` measurements of each, at ``p_value``."""

    fraction: float
    ratio: float | None
    low: float | None
    high: float | None
    confidence: float
    fresh: int
    p_value: float


@dataclass(frozen=True)
class Choice:
    """The configuration written (``group``), which outcome it is, why, and what it was held
    against: the baseline's group, the closest searched configuration (where the defaults are
    kept) and the spec's candidates."""

    group: Group
    outcome: str
    why: str = ""
    baseline: Group | None = None
    closest: Group | None = None
    candidates: tuple[Group, ...] = ()
    # Whether the study holds any re-measurement (the confirm step ran).
    confirmation: bool = False
    # How much better a tuned configuration is on fresh engines (``TUNED`` only).
    gain: Gain | None = None

    @property
    def meets_slos(self) -> bool:
        return self.outcome != MISSES

    @property
    def keeps_defaults(self) -> bool:
        return self.outcome == DEFAULTS

    @property
    def unconfirmed(self) -> bool:
        """A searched configuration written where the baseline did not meet the SLOs, with no
        test on fresh engines behind it."""
        return self.outcome == UNCONFIRMED

    @property
    def trial(self) -> FrozenTrial:
        """The measurement that stands for the configuration: the one written."""
        return self.group.median_trial

    @property
    def measurements(self) -> tuple[int, ...]:
        """The numbers of the trials the median is over, the first trial first."""
        return tuple(t.number for t in self.group.trials)

    @property
    def other(self) -> Group | None:
        """What the written configuration is shown against: the closest searched one where the
        defaults are kept, else the defaults."""
        return self.closest if self.keeps_defaults else self.baseline


def choose(study: optuna.Study) -> Choice | None:
    """The configuration tuner writes for ``study``; None if no trial served."""
    served = groups(study)
    feasible, baseline, candidates = rank(served)
    confirmation = any_confirms(study)
    if not feasible:
        # A configuration whose client fell behind is not ranked while any other served.
        kept = [g for g in served if not TrialRecord.of(g.first).client_behind] or served
        if not kept:
            return None
        closest = min(kept, key=Group.key)
        why = "no configuration met the SLOs"
        return Choice(closest, MISSES, why, baseline, confirmation=confirmation)
    found = _searched(feasible, baseline)
    held = Choice(feasible[0], TUNED, "", baseline, None, tuple(candidates), confirmation)
    if baseline is None:
        return replace(held, group=_most_measured(found), outcome=UNCONFIRMED, why=_unserved(study))
    state = confirm.current(study, significance.MIN_FRESH)
    if state is not None and state.confirmed:
        mine, theirs = state.finalist_fresh, state.baseline_fresh
        resolution = _resolution(study)
        gain = gain_of(state, resolution)
        why = beats_words(state, gain)
        return replace(held, group=mine, baseline=theirs, why=why, gain=gain)
    if not baseline.feasible:
        return _defaults_miss(held, found, state, _name(baseline))
    nearest = state.finalist if state is not None else next(iter(found), None)
    pruned = tuple(t.number for t in study.get_trials(deepcopy=False, states=(TrialState.PRUNED,)))
    why = _kept_because(baseline, state, searched=len(served) > 1, pruned=pruned)
    if state is not None and state.finalist_fresh.trials:
        nearest = state.finalist_fresh
    return replace(held, group=baseline, outcome=DEFAULTS, why=why, closest=nearest)


def _defaults_miss(
    held: Choice, found: list[Group], state: confirm.Round | None, name: str
) -> Choice:
    """Where the baseline (``name``: vLLM's defaults, or the spec's) misses the SLOs and the
    finalist was not confirmed: without fresh measurements, the searched configuration that met
    them, said to be unconfirmed; with fresh measurements against it, the finalist as the
    closest (neither meets them reliably)."""
    miss, them = ("miss", "them") if name == VLLM_DEFAULTS else ("misses", "it")
    if state is None or not (state.failed or state.baseline_fresh.trials):
        winner = _most_measured(found)
        why = (
            f"meets the SLOs where {name} {miss} them, in the search's measurements: "
            f"not confirmed on fresh engines ({name} not measured again)"
        )
        return replace(held, group=winner, outcome=UNCONFIRMED, why=why)
    missed = sum(1 for v in state.finalist_fresh.oriented() if v == -math.inf)
    fresh = len(state.finalist_fresh.trials)
    if state.failed:
        numbers = ", ".join(str(n) for n in state.failed)
        how = f"its fresh engine did not serve: trial {numbers}"
    elif missed:
        how = f"it missed them in {missed} of {fresh}"
    else:
        engines = f"each of its {fresh}" if fresh > 1 else "its one"
        how = f"it met them on {engines} but was not better in every pair"
    why = (
        f"{name} {miss} the SLOs, and the finalist, trial {state.finalist.number}, did "
        f"not beat {them} on fresh engines ({how})"
    )
    return replace(held, group=state.finalist, outcome=MISSES, why=why)


def _unserved(study: optuna.Study) -> str:
    """Why a searched configuration is written unconfirmed where the baseline never served."""
    tried = [t for t in study.get_trials(deepcopy=False) if TrialRecord.of(t).baseline]
    name = TrialRecord.of(tried[0]).baseline_name if tried else VLLM_DEFAULTS
    numbers = ", ".join(str(t.number) for t in tried)
    started = f" (trial{'s' if len(tried) > 1 else ''} {numbers})" if tried else ""
    return (
        f"meets the SLOs where {name} did not serve{started}: not confirmed on fresh engines, "
        "with no baseline to test it against"
    )


def _most_measured(found: list[Group]) -> Group:
    """Feasibility first; among the feasible (best median first), the one measured most often."""
    most = max(g.measured for g in found)
    return next(g for g in found if g.measured == most)


def gain_of(state: confirm.Round, resolution: float = 0.0) -> Gain:
    """The figures of a round's verdict: the finalist's fresh measurements against the
    baseline's (``ratio_of``'s ratio and interval, the upper end widened by ``resolution``)."""
    mine, theirs = state.finalist_fresh, state.baseline_fresh
    bounds = ratio_of(mine, theirs, resolution)
    ratio, low, high = bounds if bounds is not None else (None, None, None)
    return Gain(
        fraction=mine.gain_over(theirs),
        ratio=ratio,
        low=low,
        high=high,
        confidence=significance.CONFIDENCE,
        fresh=len(mine.trials),
        p_value=state.p_value(),
    )


def beats_words(state: confirm.Round, gain: Gain) -> str:
    """``beats vLLM's defaults on fresh engines: 61% better by the median (1.61x, 90% interval
    1.27 to 1.94x; 3 fresh engines each, every pair in its favour, p = 0.05)``: the round's
    ``gain`` (``gain_of``) in words."""
    how = f"{gain.fresh} fresh engines each, every pair in its favour, p = {gain.p_value:.2g}"
    name = _name(state.baseline)
    return (
        f"beats {name} on fresh engines: {gain.fraction:.0%} better by the median "
        f"({interval_words(gain)}; {how})"
    )


def ratio_of(
    mine: Group, theirs: Group, resolution: float = 0.0
) -> tuple[float, float, float] | None:
    """How many times better ``mine`` is than ``theirs`` (a capacity: its ratio; a latency
    score: theirs over mine), with the interval of
    ``tuner.study.trials.significance.ratio_interval`` (its upper end widened by
    ``resolution``): a measurement that missed the SLOs ranks below every other, as in the
    test, so a confirmed verdict's interval is above 1.0x. None where a median measurement
    missed the SLOs or is 0."""
    a, b = _carried(mine), _carried(theirs)
    ratio = significance.ratio(a, b)
    interval = significance.ratio_interval(a, b, resolution=resolution)
    if ratio is None or interval is None:
        return None
    return ratio, *interval


def interval_words(gain: Gain) -> str:
    """``1.61x, 90% interval 1.27 to 1.94x``: ``gain``'s ratio and interval."""
    ratio, low, high = gain.ratio, gain.low, gain.high
    if ratio is None or low is None or high is None:
        return "no ratio: a median measurement missed the SLOs or is 0"
    level = f"{gain.confidence:.0%} interval"
    if math.isinf(high):
        return f"{ratio:.2f}x, {level} from {low:.2f}x (too few measurements to bound it above)"
    return f"{ratio:.2f}x, {level} {low:.2f} to {high:.2f}x"


def _carried(group: Group) -> list[float]:
    """Its measurements on the ratio scale, as the rank test orders them: a value that met the
    SLOs upward (higher better), 0 for one that missed them or is not positive."""
    objective = group.objective
    return [
        objective.upward(t.value) if TrialRecord.of(t).feasible and t.value > 0 else 0.0
        for t in group.trials
        if t.value is not None
    ]


def _resolution(study: optuna.Study) -> float:
    """The capacity search's resolution the study was measured at (0 for a latency study)."""
    recorded = study.user_attrs.get(fingerprint.WORKLOAD_ATTR) or {}
    value = recorded.get("capacity_resolution") if isinstance(recorded, dict) else None
    return float(value) if isinstance(value, int | float) else 0.0


def _searched(feasible: list[Group], baseline: Group | None) -> list[Group]:
    """The feasible configurations that are not the defaults, best median first."""
    return [g for g in feasible if baseline is None or g.number != baseline.number]


def _kept_because(
    baseline: Group, state: confirm.Round | None, searched: bool, pruned: tuple[int, ...] = ()
) -> str:
    """Why the defaults are kept, in one line (``state``: the confirmation of the finalist;
    ``searched``: any other configuration served; ``pruned``: the trials stopped early)."""
    if state is None and not searched and pruned:
        numbers = ", ".join(str(n) for n in pruned)
        trials = f"trial{'s' if len(pruned) > 1 else ''} {numbers}"
        return f"every searched configuration was stopped early, behind the best so far ({trials})"
    if state is None and not searched:
        return "no other configuration was measured (the time budget or --n-trials ended the run)"
    if state is None:
        return "no searched configuration met the SLOs"
    return _not_confirmed(baseline, state)


def _not_confirmed(baseline: Group, state: confirm.Round) -> str:
    """Why the round did not confirm its finalist, in one line."""
    final = state.finalist
    objective = final.objective
    margin = _margin(confirm.searched_only(final).gain_over(confirm.searched_only(baseline)))
    named = f"the finalist, trial {final.number} ({margin} by the median in the search)"
    if state.failed:
        numbers = ", ".join(str(n) for n in state.failed)
        return f"{named} did not serve on a fresh engine (trial {numbers})"
    against = state.against
    if against is not None:
        mine, theirs = against
        return (
            f"{named} did not beat them on fresh engines: its trial {mine.number} "
            f"({_value(objective, mine)}) against their trial {theirs.number} "
            f"({_value(objective, theirs)}) favours the {_label(baseline)}"
        )
    met = state.defaults_meet()
    if met:
        rate = words_of(objective).text(state.finalist_fresh.median)
        return (
            f"{named} was better in every fresh pair, but at {rate}, its confirmed capacity, "
            f"{_name(baseline)} met the SLOs too (trial {met[0].number}): no gain shown"
        )
    ours, others = len(state.finalist_fresh.trials), len(state.baseline_fresh.trials)
    fewest = significance.MIN_FRESH
    if not ours and not others:
        return (
            f"{named} was not measured on fresh engines (the time budget held none, or the "
            "spec turns the confirmation off): no verdict without them"
        )
    if min(ours, others) < fewest or ours != others:
        return (
            f"{named} was measured {_times(ours)} on fresh engines and the {_label(baseline)} "
            f"{_times(others)}, short of the {fewest} each a verdict needs (the time budget or "
            "confirm_repeats ended the confirmation): no verdict from fewer"
        )
    return f"{named} did not beat them beyond chance on fresh engines"


def _name(baseline: Group) -> str:
    """``vLLM's defaults``, or ``your configuration`` where the spec named its own baseline."""
    return TrialRecord.of(baseline.first).baseline_name


def _label(baseline: Group) -> str:
    return TrialRecord.of(baseline.first).baseline_label


def _margin(gain: float) -> str:
    return f"{abs(gain):.0%} {'better' if gain >= 0 else 'worse'}"


def _value(objective: StudyObjective, trial: FrozenTrial) -> str:
    recorded = TrialRecord.of(trial)
    text = words_of(objective).text(float(trial.value or 0.0))
    return text if recorded.feasible else f"{text}, missed the SLOs"


def _times(count: int) -> str:
    return "once" if count == 1 else f"{count} times"


def describe(group: Group, label: str) -> str:
    """``winner trial 7: score median 0.612 of 3 (0.58 to 0.66; trials 7, 12, 15)``; the spec's
    ``{}`` candidate as ``winner trial 1 (vLLM's defaults): ...``."""
    values = group.values
    numbers = ", ".join(str(t.number) for t in group.trials)
    said = words_of(group.objective)
    what, unit = said.name, said.unit
    named = f"{label} trial {group.number}"
    if label != VLLM_DEFAULTS:
        named += TrialRecord.of(group.first).defaults_aside
    if len(values) == 1:
        return f"{named}: {what} {values[0]:.4g}{unit}, measured once"
    low, high = min(values), max(values)
    return (
        f"{named}: {what} median {group.median:.4g}{unit} of "
        f"{len(values)} ({low:.4g} to {high:.4g}; trials {numbers})"
    )


def changed(
    group: Group, baseline: Group | None, vllm_defaults: Mapping[str, Any] | None = None
) -> str:
    """The engine arguments ``group`` sets otherwise than the baseline's trial, as NAME=VALUE
    words, and those the baseline sets that it leaves to vLLM. With ``vllm_defaults`` (vLLM's
    own values of the searched arguments, as the spec gives them), a value moved from vLLM's is
    followed by vLLM's, and those set to vLLM's own value (written so that the file does not
    depend on what a later vLLM defaults to) come last, apart:
    ``max-num-batched-tokens=2048 (vLLM's 8192); as vLLM sets them: max-num-seqs=1024``."""
    mine: dict[str, Any] = dict(TrialRecord.of(group.first).engine_args)
    theirs: dict[str, Any] = {}
    if baseline is not None:
        theirs = dict(TrialRecord.of(baseline.first).engine_args)
    known = vllm_defaults or {}
    moved: list[str] = []
    kept: list[str] = []
    for key, value in mine.items():
        if key in theirs and theirs[key] == value:
            continue
        if key not in known:
            moved.append(f"{key}={value}")
        elif known[key] == value:
            kept.append(f"{key}={value}")
        else:
            moved.append(f"{key}={value} (vLLM's {known[key]})")
    # What the baseline sets that this configuration leaves to vLLM (a baseline of the spec's
    # own against vLLM's defaults, or a searched point that unsets it).
    left = [f"{key} (the baseline's {theirs[key]})" for key in theirs if key not in mine]
    clauses = [" ".join(moved)] if moved else []
    if left:
        clauses.append(f"left to vLLM: {', '.join(left)}")
    if not kept:
        return "; ".join(clauses) or "(the same arguments)"
    if not clauses:
        return f"only what vLLM sets itself: {' '.join(kept)}"
    return f"{'; '.join(clauses)}; as vLLM sets them: {' '.join(kept)}"


def summary(choice: Choice, vllm_defaults: Mapping[str, Any] | None = None) -> list[str]:
    """The lines ``tuner run`` prints and the YAML header carries about the outcome: the
    configuration written against vLLM's defaults (or the closest searched one against them),
    what it sets (``changed``, with ``vllm_defaults``), and the re-measured candidates."""
    if choice.outcome == MISSES:
        return []
    lines: list[str] = []
    if choice.keeps_defaults:
        kept = TrialRecord.of(choice.group.first)
        lines.append(f"{kept.baseline_name} kept: {choice.why}")
        if choice.baseline is not None:
            lines.append(describe(choice.baseline, _label(choice.baseline)))
        if choice.closest is not None:
            lines.append(describe(choice.closest, "closest searched"))
            lines.append(f"  it sets {changed(choice.closest, choice.baseline, vllm_defaults)}")
    else:
        lines.append(describe(choice.group, "unconfirmed" if choice.unconfirmed else "winner"))
        lines.append(f"  it sets {changed(choice.group, choice.baseline, vllm_defaults)}")
        if choice.baseline is not None:
            lines.append(describe(choice.baseline, _label(choice.baseline)))
        lines.append(choice.why)
    if choice.baseline is not None:
        baseline = choice.baseline
        lines += words_of(of_trial(baseline.first)).at_one_rate(baseline.trials, _name(baseline))
    return lines + _against_candidates(choice)


def _against_candidates(choice: Choice) -> list[str]:
    """The re-measured candidates (``confirm_candidates``) against the configuration written.
    Like against like: where what is written is the finalist's fresh measurements, a candidate
    is held against it by its re-measurements alone (as many as those), not its search's."""
    lines = []
    written = choice.group
    fresh = written.number not in {t.number for t in written.trials}
    for group in choice.candidates:
        if fresh:
            group = Group(group.first, group.trials[1:], group.objective)
        if len(group.values) < 2 or group.number == written.number:
            continue
        name = TrialRecord.of(group.first).candidate_name
        lines.append(describe(group, name))
        if len(written.values) > 1 and written.beats(group):
            how = "the measured spread" if written.in_every_measurement(group) else "chance"
            lines.append(f"beats {name} trial {group.number} beyond {how}")
        else:
            lines.append(f"within noise of {name} trial {group.number}")
    return lines
