"""The outcome of a study as JSON, for a program to read: ``tuner run --json FILE`` and
``tuner report NAME --json FILE`` (``-``: standard output).

One function (``result_document``) builds it from the study, from what the terminal's lines, the
YAML's header and the report's verdict are built from: ``tuner.study.result.choice.choose``
(the outcome, why, the gain where the configuration is confirmed), the configurations' groups
and their medians (``tuner.study.trials.groups``) and the confirmation's round
(``tuner.study.trials.confirm.current``); so a run's document and a later report's say the same.
Only numbers, strings, booleans, null, lists and objects: a figure that is not finite (a failed
trial's score, an unbounded interval) is null.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, TextIO

import optuna
from optuna.trial import FrozenTrial

from tuner.cli.exits import EXIT_FAILED
from tuner.cli.result import OUTCOME_EXITS, first_failure_words
from tuner.report.build import WRITTEN_BY, vllm_defaults
from tuner.report.data import recorded_slos, rows_of, slo_limits
from tuner.study.measure import scoring
from tuner.study.measure.time_spent import MAX_NUM_SEQS, time_spent
from tuner.study.measure.trial import TRIAL_S, WINDOW_S
from tuner.study.result.choice import Choice, Gain, choose
from tuner.study.result.emit import served_args
from tuner.study.result.written import write_whole
from tuner.study.setup.objective import of_study
from tuner.study.store.record import TrialRecord
from tuner.study.trials import confirm, picks, significance
from tuner.study.trials.groups import Group, groups
from tuner.urls import shown_url

# The document's layout; raised where a field changes meaning or goes, not where one is added.
SCHEMA_VERSION = 1
# ``--json -``: standard output.
STDOUT = "-"
# The outcome where no trial served (nothing written; ``tuner run`` exits 1).
NOTHING = "none"
# A configuration's role: the baseline (vLLM's defaults or the spec's), the search's finalist
# (held against it on fresh engines), one of the spec's candidates, or another searched one.
BASELINE, FINALIST, CANDIDATE, SEARCHED = "baseline", "finalist", "candidate", "searched"


def result_document(study: optuna.Study, storage: str, config_path: Path) -> dict[str, Any]:
    """What ``study`` (kept in ``storage``, its configuration written to ``config_path``) found:
    the outcome and the exit status ``tuner run`` gives for it, the configuration written, the
    gain where one is confirmed, each configuration with its measurements, the SLOs and the
    time the trials took."""
    choice = choose(study)
    state = confirm.current(study, significance.MIN_FRESH)
    objective = of_study(study)
    trials = study.get_trials(deepcopy=False)
    outcome = NOTHING if choice is None else choice.outcome
    document = {
        "schema": SCHEMA_VERSION,
        "study": study.study_name,
        "storage": shown_url(storage),
        "objective": {
            "mode": objective.mode,
            "metric": objective.metric,
            "direction": objective.direction.name.lower(),
        },
        "outcome": outcome,
        "why": _nothing_served(study) if choice is None else choice.why,
        "compared": _compared(state),
        "exit_status": EXIT_FAILED if choice is None else OUTCOME_EXITS[outcome],
        "written": None if choice is None else _written(study, choice, config_path),
        "gain": None if choice is None or choice.gain is None else _gain(choice.gain),
        "confirmation": None if state is None else _confirmation(state),
        "configurations": [_configuration(g, choice, state) for g in groups(study)],
        "slos": recorded_slos(study.user_attrs) or slo_limits(rows_of(trials)),
        "time_s": _time_s(trials),
    }
    return _plain(document)


def write_document(document: Mapping[str, Any], target: str, stdout: TextIO) -> None:
    """Write ``document`` to the file ``target`` whole, or to ``stdout`` where it is ``-``."""
    text = json.dumps(document, indent=2, allow_nan=False) + "\n"
    if target == STDOUT:
        stdout.write(text)
        stdout.flush()
    else:
        write_whole(Path(target), text)


@contextlib.contextmanager
def lines_to_stderr(target: str | None) -> Iterator[TextIO]:
    """Where the document goes (standard output as it was), with what tuner prints for people
    sent to standard error meanwhile where the document is ``-``: standard output then carries
    the document alone."""
    stdout = sys.stdout
    if target != STDOUT:
        yield stdout
        return
    with contextlib.redirect_stdout(sys.stderr):
        yield stdout


def _nothing_served(study: optuna.Study) -> str:
    """Why nothing is written, as ``tuner run`` says it: the first trial that failed."""
    return f"no trial served its window; first failure: {first_failure_words(study)}"


def _compared(state: confirm.Round | None) -> bool:
    """Whether the finalist was held against the baseline on fresh engines: a fresh
    measurement of either was taken (one whose engine failed included)."""
    if state is None:
        return False
    return bool(state.finalist_fresh.trials or state.baseline_fresh.trials or state.failed)


def _written(study: optuna.Study, choice: Choice, config_path: Path) -> dict[str, Any]:
    """The configuration written: the trial that stands for it, its engine arguments as the
    file carries them, its measurements, the SLOs it missed, what it was held against, where
    its time went, and the file where it names this study and trial."""
    chosen = choice.trial
    recorded = TrialRecord.of(chosen)
    verdict = scoring.verdict(picks.constraints_of(chosen), recorded.figures)
    seqs = vllm_defaults(study).get(MAX_NUM_SEQS)
    seqs = seqs if isinstance(seqs, int) else None
    spent = time_spent(recorded.figures, seqs, recorded.engine_args)
    return {
        "trial": chosen.number,
        "configuration": choice.group.number,
        "engine_args": served_args(recorded.engine_args),
        "meets_slos": choice.meets_slos,
        "misses": [
            {"metric": m.metric, "measured": m.measured, "limit": m.limit} for m in verdict.misses
        ],
        "median": choice.group.median,
        "measurements": list(choice.measurements),
        "baseline": _held(choice.baseline),
        "closest": _held(choice.closest),
        "path": str(config_path) if _names(config_path, study.study_name, chosen.number) else None,
        "time_spent": dataclasses.asdict(spent) if spent.measured else None,
    }


def _names(path: Path, study: str, trial: int) -> bool:
    """Whether the configuration file at ``path`` is there and names ``study``'s ``trial``."""
    if not path.is_file():
        return False
    found = WRITTEN_BY.search(path.read_text())
    return found is not None and found["study"] == study and int(found["trial"]) == trial


def _held(group: Group | None) -> dict[str, Any] | None:
    """A configuration the one written was held against, as the summary's lines give it: its
    first trial, its median and the measurements it is over."""
    if group is None:
        return None
    return {
        "trial": group.number,
        "median": group.median if group.values else None,
        "measurements": [t.number for t in group.trials],
    }


def _gain(gain: Gain) -> dict[str, Any]:
    """The confirmed gain's figures (``tuner.study.result.choice.Gain``)."""
    return dataclasses.asdict(gain)


def _confirmation(state: confirm.Round) -> dict[str, Any]:
    """The study's round: its finalist and baseline, their fresh measurements, the finalist's
    fresh engines that failed, the first pair against it, and whether it confirmed it."""
    against = state.against
    return {
        "finalist": state.finalist.number,
        "baseline": state.baseline.number,
        "finalist_fresh": [t.number for t in state.finalist_fresh.trials],
        "baseline_fresh": [t.number for t in state.baseline_fresh.trials],
        "failed": list(state.failed),
        "against": None if against is None else [t.number for t in against],
        "confirmed": state.confirmed,
    }


def _configuration(
    group: Group, choice: Choice | None, state: confirm.Round | None
) -> dict[str, Any]:
    """One configuration: its first trial, role, engine arguments, median, feasibility, and
    each measurement (fresh ones marked; those whose client fell behind marked, and in no
    median)."""
    recorded = TrialRecord.of(group.first)
    if recorded.baseline:
        role = BASELINE
    elif state is not None and group.number == state.finalist.number:
        role = FINALIST
    elif recorded.candidate is not None:
        role = CANDIDATE
    else:
        role = SEARCHED
    measured = sorted((*group.trials, *group.left_out), key=lambda t: t.number)
    return {
        "trial": group.number,
        "role": role,
        "candidate": recorded.candidate,
        "engine_args": dict(recorded.engine_args),
        "median": group.median if group.values else None,
        "feasible": group.feasible,
        "written": choice is not None and group.number == choice.group.number,
        "measurements": [_measurement(t) for t in measured],
    }


def _measurement(trial: FrozenTrial) -> dict[str, Any]:
    """One measurement: its trial, value, feasibility, whether it was taken on a fresh engine
    for the confirmation, and its phases' seconds."""
    recorded = TrialRecord.of(trial)
    return {
        "trial": trial.number,
        "value": recorded.value,
        "feasible": recorded.feasible,
        "fresh": recorded.fresh is not None,
        "client_behind": recorded.client_behind,
        "timings_s": dict(recorded.timings_s),
    }


def _time_s(trials: list[FrozenTrial]) -> dict[str, Any] | None:
    """The seconds the study's timed trials took in all, and measured; None where none
    recorded its time."""
    timed = [TrialRecord.of(t).timings_s for t in trials]
    timed = [t for t in timed if TRIAL_S in t]
    if not timed:
        return None
    return {
        "trials": len(timed),
        "total": sum(t[TRIAL_S] for t in timed),
        "measuring": sum(t.get(WINDOW_S, 0.0) for t in timed),
    }


def _plain(value: Any) -> Any:
    """``value`` as JSON holds it: mappings with string keys, lists, finite numbers (others
    null), strings, booleans and null; anything else as its text."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, bool) or value is None or isinstance(value, str | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    return str(value)
