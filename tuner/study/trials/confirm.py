"""The noise-aware winner: re-measure the top trials and the baseline, choose by the median.

One configuration measured twice differs by 10 to 20 % (the H100; more on a shared CPU), so a
winner picked from one measurement each is partly luck. After a run's trials, the top
``confirm_top_k`` feasible configurations and the baseline are measured ``confirm_repeats``
more times each, on fresh engines, in turns (A, B, baseline, A, B, baseline), so that a slow
minute of the machine does not fall on one configuration. Each re-measurement is a trial of its
own with the user attribute ``confirms`` (the trial it repeats) and the same parameters, so
the dashboard shows it and the sampler learns from it.

What is written then is ``tuner.study.result.choice``'s: a searched configuration only where
it beats the baseline beyond chance, measured as often as the baseline; else vLLM's
defaults. Where no configuration met the SLOs there is nothing to hold against the defaults,
and nothing is measured again: the closest configuration is written as it was measured. Where
the defaults alone served, they are measured again all the same (``tuner.study.result.run``):
they are what is written, and their capacity is what a user plans servers by.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import optuna
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.trial import FrozenTrial

from tuner.study.measure.record import Queued, TrialRecord
from tuner.study.trials.budget import Budget
from tuner.study.trials.groups import Group, ranked
from tuner.study.trials.search import Measuring, measure

logger = logging.getLogger(__name__)


def to_confirm(study: optuna.Study, top_k: int, candidates: bool = False) -> list[Group]:
    """The top ``top_k`` feasible searched configurations by median, then the baseline, then
    (``candidates``) the spec's candidates not among them; nothing where no configuration is
    feasible (the baseline and the candidates are measured again to be held against a winner,
    or as the answer written where the baseline alone served).

    The baseline does not take a searched configuration's place when it leads: the best
    searched one is measured as often as vLLM's defaults either way, so the result holds like
    against like whichever wins (the budget plans for both).
    """
    ranked_groups, baseline, spec_candidates = ranked(study)
    if top_k <= 0 or not ranked_groups:
        return []
    searched = [g for g in ranked_groups if baseline is None or g.number != baseline.number]
    top = searched[:top_k]
    for extra in [baseline, *(spec_candidates if candidates else [])]:
        if extra is not None and all(g.number != extra.number for g in top):
            top.append(extra)
    return top


def short(study: optuna.Study, top_k: int, repeats: int, candidates: bool = False) -> list[Group]:
    """The configurations ``to_confirm`` names that have fewer than ``1 + repeats``
    measurements.

    Measurements taken count, not only those in the median: a configuration whose client fell
    behind on every re-measurement would otherwise be measured until the time ran out (the H100
    study of benchmarks/results/h100.md re-measured its baseline six times).
    """
    return [g for g in to_confirm(study, top_k, candidates) if g.measured < 1 + repeats]


OnTrial = Callable[[FrozenTrial], None]


def confirm(
    study: optuna.Study,
    how: Measuring,
    top_k: int,
    repeats: int,
    on_trial: OnTrial | None = None,
    budget: Budget | None = None,
    candidates: bool = False,
) -> int:
    """Re-measure the top ``top_k`` configurations and the baseline (and, with ``candidates``,
    the spec's candidates) until each has ``repeats`` measurements beyond its first, in turns;
    return how many trials ran.

    The top is taken again after every turn: a leader whose re-measurements pull its median
    down gives way, and the configuration that overtakes it is measured in its turn too (on
    the demo, the baseline led by one measurement, fell behind on two more, and the winner was
    left measured once). Each turn measures the configurations with the fewest measurements,
    best first. Configurations measured enough already (an earlier run's confirmation) are
    not measured again; at most ``repeats * (2 * top_k + 2 + C)`` trials run, C the number of
    candidates re-measured; with a ``budget``, none starts that would end after it.
    """
    if top_k <= 0 or repeats <= 0:
        return 0
    extra = len(ranked(study)[2]) if candidates else 0
    limit = repeats * (2 * top_k + 2 + extra)
    ran = 0
    while ran < limit:
        pending = short(study, top_k, repeats, candidates)
        if not pending:
            break
        fewest = min(g.measured for g in pending)
        for group in [g for g in pending if g.measured == fewest]:
            if ran >= limit:
                break
            if budget is not None and not budget.may_confirm():
                logger.info("time budget reached while confirming, after %d trials", ran)
                return ran
            began = time.monotonic()
            frozen = _measure_again(study, group.first, how)
            ran += 1
            if budget is not None:
                budget.spent(time.monotonic() - began, confirming=True)
            if on_trial is not None:
                on_trial(frozen)
    return ran


def _measure_again(study: optuna.Study, first: FrozenTrial, how: Measuring) -> FrozenTrial:
    """One more measurement of ``first``'s configuration, as a trial of its own."""
    study.enqueue_trial(dict(first.params), user_attrs=Queued(confirms=first.number).attrs())
    trial = study.ask()
    for name, distribution in first.distributions.items():
        _suggest_again(trial, name, distribution)
    recorded = TrialRecord.of(first)
    return measure(
        study, trial, recorded.engine_args, how, prunable=False, compared=recorded.baseline
    )


def _suggest_again(trial: optuna.Trial, name: str, distribution: BaseDistribution) -> None:
    """Suggest ``name`` over ``distribution``: the enqueued value comes back, and the trial
    holds it as a parameter like the first measurement did."""
    if isinstance(distribution, IntDistribution):
        d = distribution
        trial.suggest_int(name, d.low, d.high, step=d.step, log=d.log)
    elif isinstance(distribution, FloatDistribution):
        f = distribution
        trial.suggest_float(name, f.low, f.high, step=f.step, log=f.log)
    elif isinstance(distribution, CategoricalDistribution):
        trial.suggest_categorical(name, distribution.choices)
