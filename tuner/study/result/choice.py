"""The configuration tuner writes, and the trial that stands for it: one choice, read by
``tuner run`` (the YAML it writes and its exit status), ``tuner report`` (the page's verdict) and
the GPU runner's tables, so that they cannot name different winners.

A configuration is its first trial and the confirm step's re-measurements of it
(``tuner.study.trials.groups.groups``). The choice has three outcomes:

- ``TUNED``: a searched configuration beats vLLM's defaults (the baseline) beyond chance:
  measured at least as many times as the defaults, and more than once, it passes the rank test
  of ``tuner.study.trials.significance`` against them (at 3 measurements against 3: its worst
  is better than their best, "beyond the measured spread"). Of those, the best median.
  Feasibility comes first: a configuration that meets the SLOs beats defaults that miss them (or
  did not serve), and then the best median among the configurations measured most often wins,
  so a single lucky measurement never beats a repeated one.
- ``DEFAULTS``: the defaults meet the SLOs and no searched configuration beats them beyond the
  spread (or none was measured as often as they were): the defaults are written, and the choice
  names the closest searched configuration and by how much it differed.
- ``MISSES``: no configuration met the SLOs; the closest is written, the served configuration
  with the best median, one whose client kept up where any did.

The trial that stands for a configuration is its median measurement (``Group.median_trial``): a
real one, whose engine arguments and figures are written.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from tuner.study.measure.objective import of_trial
from tuner.study.measure.record import TrialRecord
from tuner.study.trials.groups import Group, any_confirms, groups, rank

TUNED = "tuned"
DEFAULTS = "defaults"
MISSES = "misses"


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

    @property
    def meets_slos(self) -> bool:
        return self.outcome != MISSES

    @property
    def keeps_defaults(self) -> bool:
        return self.outcome == DEFAULTS

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
    if baseline is None or not baseline.feasible:
        # Feasibility first; among the feasible, those measured most often.
        most = max(g.measured for g in found)
        winner = next(g for g in found if g.measured == most)
        why = "vLLM's defaults " + ("did not serve" if baseline is None else "miss the SLOs")
        return replace(held, group=winner, why=f"meets the SLOs where {why}")
    often = _as_often(found, baseline)
    beyond = [g for g in often if baseline.measured > 1 and g.beats(baseline)]
    if beyond:
        winner = beyond[0]
        gain = f"{winner.gain_over(baseline):.0%} better by the median"
        if winner.in_every_measurement(baseline):
            why = (
                f"beats vLLM's defaults beyond the measured spread: {gain}, and better in every "
                "measurement"
            )
        else:
            why = (
                f"beats vLLM's defaults beyond chance: {gain}, better in "
                f"{winner.pairs_won(baseline)} of measurements (a rank test: p <= 0.05)"
            )
        return replace(held, group=winner, why=why)
    nearest = next(iter(often), None) or next(iter(found), None)
    pruned = tuple(t.number for t in study.get_trials(deepcopy=False, states=(TrialState.PRUNED,)))
    why = _kept_because(baseline, nearest, searched=len(served) > 1, pruned=pruned)
    return replace(held, group=baseline, outcome=DEFAULTS, why=why, closest=nearest)


def _searched(feasible: list[Group], baseline: Group | None) -> list[Group]:
    """The feasible configurations that are not the defaults, best median first."""
    return [g for g in feasible if baseline is None or g.number != baseline.number]


def _as_often(found: list[Group], baseline: Group) -> list[Group]:
    """Those measured at least as many times as the defaults: like against like."""
    return [g for g in found if g.measured >= baseline.measured]


def _kept_because(
    baseline: Group, closest: Group | None, searched: bool, pruned: tuple[int, ...] = ()
) -> str:
    """Why the defaults are kept, in one line (``searched``: any other configuration served;
    ``pruned``: the numbers of the trials stopped early)."""
    if closest is None and not searched and pruned:
        numbers = ", ".join(str(n) for n in pruned)
        trials = f"trial{'s' if len(pruned) > 1 else ''} {numbers}"
        return f"every searched configuration was stopped early, behind the best so far ({trials})"
    if closest is None and not searched:
        return "no other configuration was measured (the time budget or --n-trials ended the run)"
    if closest is None:
        return "no searched configuration met the SLOs"
    gain = closest.gain_over(baseline)
    margin = f"{abs(gain):.0%} {'better' if gain >= 0 else 'worse'} by the median"
    if baseline.measured < 2:
        return (
            f"vLLM's defaults were measured once, so no spread says whether trial "
            f"{closest.number} ({margin}) beats them: the confirmation did not run"
        )
    if closest.measured < baseline.measured:
        return (
            f"the closest searched configuration, trial {closest.number} ({margin}), was "
            f"measured {_times(closest.measured)}, the defaults {_times(baseline.measured)}"
        )
    if gain <= 0:
        return f"nothing searched beat them: the closest, trial {closest.number}, is {margin}"
    return (
        f"no searched configuration beats them beyond the measured spread: the closest, trial "
        f"{closest.number}, is {margin}, within the spread"
    )


def _times(count: int) -> str:
    return "once" if count == 1 else f"{count} times"


def describe(group: Group, label: str) -> str:
    """``winner trial 7: score median 0.612 of 3 (0.58 to 0.66; trials 7, 12, 15)``."""
    values = group.values
    numbers = ", ".join(str(t.number) for t in group.trials)
    what, unit = group.objective.value_name, group.objective.value_unit
    if len(values) == 1:
        return f"{label} trial {group.number}: {what} {values[0]:.4g}{unit}, measured once"
    low, high = min(values), max(values)
    return (
        f"{label} trial {group.number}: {what} median {group.median:.4g}{unit} of "
        f"{len(values)} ({low:.4g} to {high:.4g}; trials {numbers})"
    )


def changed(
    group: Group, baseline: Group | None, vllm_defaults: Mapping[str, Any] | None = None
) -> str:
    """The engine arguments ``group`` sets otherwise than the defaults' trial, as NAME=VALUE
    words. With ``vllm_defaults`` (vLLM's own values of the searched arguments, as the spec gives
    them), a value moved from vLLM's is followed by vLLM's, and those set to vLLM's own value
    (written so that the file does not depend on what a later vLLM defaults to) come last, apart:
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
    if not kept:
        return " ".join(moved) or "(the same arguments)"
    if not moved:
        return f"only what vLLM sets itself: {' '.join(kept)}"
    return f"{' '.join(moved)}; as vLLM sets them: {' '.join(kept)}"


def summary(choice: Choice, vllm_defaults: Mapping[str, Any] | None = None) -> list[str]:
    """The lines ``tuner run`` prints and the YAML header carries about the outcome: the
    configuration written against vLLM's defaults (or the closest searched one against them),
    what it sets (``changed``, with ``vllm_defaults``), and the re-measured candidates."""
    if choice.outcome == MISSES:
        return []
    lines: list[str] = []
    if choice.keeps_defaults:
        lines.append(f"vLLM's defaults kept: {choice.why}")
        if choice.baseline is not None:
            lines.append(describe(choice.baseline, "defaults"))
        if choice.closest is not None:
            lines.append(describe(choice.closest, "closest searched"))
            lines.append(f"  it sets {changed(choice.closest, choice.baseline, vllm_defaults)}")
    else:
        lines.append(describe(choice.group, "winner"))
        lines.append(f"  it sets {changed(choice.group, choice.baseline, vllm_defaults)}")
        if choice.baseline is not None:
            lines.append(describe(choice.baseline, "defaults"))
        lines.append(choice.why)
    if choice.baseline is not None:
        lines += of_trial(choice.baseline.first).at_one_rate(choice.baseline.trials)
    return lines + _against_candidates(choice)


def _against_candidates(choice: Choice) -> list[str]:
    """The re-measured candidates (``confirm_candidates``) against the configuration written."""
    lines = []
    written = choice.group
    for group in choice.candidates:
        if len(group.values) < 2 or group.number == written.number:
            continue
        lines.append(describe(group, "candidate"))
        if len(written.values) > 1 and written.beats(group):
            how = "the measured spread" if written.in_every_measurement(group) else "chance"
            lines.append(f"beats candidate trial {group.number} beyond {how}")
        else:
            lines.append(f"within noise of candidate trial {group.number}")
    return lines
