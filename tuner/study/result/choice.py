"""The configuration tuner writes, and the trial that stands for it: one choice, read by
``tuner run`` (the YAML it writes), ``tuner report`` (the page's verdict) and the GPU runner's
tables, so that they cannot name different winners.

A configuration is its first trial and the confirm step's re-measurements of it
(``tuner.study.trials.groups.groups``). The winner is the feasible configuration with the best
median over its measurements: the lowest score, in a capacity study the highest capacity, of equal
medians the earlier. Where none is feasible, the closest is the served configuration with the
best median, one whose client kept up where any did. The trial that stands for it is its median
measurement (``Group.median_trial``): a real one, whose engine arguments and figures are written.
Without re-measurements each configuration is one trial, and the choice is that trial.
"""

from __future__ import annotations

from dataclasses import dataclass

import optuna
from optuna.trial import FrozenTrial

from tuner.load.health import CLIENT_BEHIND
from tuner.study.trials.groups import Confirmed, Group, any_confirms, confirmed_winner, groups


@dataclass(frozen=True)
class Choice:
    """The chosen configuration's measurements, whether it meets the SLOs, and, where the
    study was confirmed, the winner held against the baseline and the candidates."""

    group: Group
    meets_slos: bool
    # None where the study holds no re-measurement or no configuration met the SLOs.
    confirmed: Confirmed | None = None

    @property
    def trial(self) -> FrozenTrial:
        """The measurement that stands for the configuration: the one written."""
        return self.group.median_trial

    @property
    def measurements(self) -> tuple[int, ...]:
        """The numbers of the trials the median is over, the first trial first."""
        return tuple(t.number for t in self.group.trials)


def choose(study: optuna.Study) -> Choice | None:
    """The configuration tuner writes for ``study``; None if no trial served."""
    confirmed = confirmed_winner(study)
    if confirmed is not None:
        shown = confirmed if any_confirms(study) else None
        return Choice(confirmed.winner, meets_slos=True, confirmed=shown)
    served = groups(study)
    # A configuration whose client fell behind is not ranked while any other served.
    kept = [g for g in served if not g.first.user_attrs.get(CLIENT_BEHIND)] or served
    if not kept:
        return None
    return Choice(min(kept, key=Group.key), meets_slos=False)
