"""The study, in floors, each importing only from those below it: its plan (``plan``: the spec
and the search space) and what it keeps (``store``: each trial's record, the storage), one trial
measured and judged (``measure``), the search over rates that answers capacity (``capacity``),
what every trial of a study shares (``setup``: the objective, the workload, the time scale), the
study's trials in Optuna (``trials``: the search, workers, confirmation) and what it answers
(``result``: the configuration chosen and written).

The names offered to code outside tuner (``benchmarks/``, an embedding program) are in
``__all__``, each imported from its module when first used (``tuner.face``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tuner.face import lazy

if TYPE_CHECKING:
    from tuner.study.capacity.probes import (
        CapacitySettings,
        StartHint,
        measure_capacity,
        measure_rate,
        reset_prefix_cache,
        wait_idle,
    )
    from tuner.study.capacity.rate_search import RateSearch
    from tuner.study.capacity.rates import SUSTAINED, CapacityFound, RatePoint, search_capacity
    from tuner.study.capacity.text import servers_for
    from tuner.study.measure.scoring import Criteria, score
    from tuner.study.measure.time_spent import time_spent
    from tuner.study.measure.trial import Ended, TrialOutcome, TrialSetup, run_trial
    from tuner.study.plan.own_server import SECTION, parse_server
    from tuner.study.plan.space import KV_ARGUMENTS, runnable_baseline
    from tuner.study.plan.spec import Dimension, StudySpec, load_spec, parse_spec
    from tuner.study.result.choice import TUNED, choose
    from tuner.study.result.run import Run
    from tuner.study.result.run_config import resolve
    from tuner.study.result.words import words_of
    from tuner.study.setup.calibrate import TimeScale
    from tuner.study.setup.objective import (
        CAPACITY_OBJECTIVE,
        LATENCY_OBJECTIVE,
        StudyObjective,
        of_spec,
        of_study,
    )
    from tuner.study.setup.prepare import (
        Workload,
        model_of,
        open_loop_replay,
        prepare,
        write_dummy_model,
    )
    from tuner.study.store.record import CONFIRMS_ATTR, TrialRecord
    from tuner.study.trials.confirm import finalist
    from tuner.study.trials.fingerprint import measured_on
    from tuner.study.trials.groups import Group, groups, rank
    from tuner.study.trials.incumbent import Taken, levels, next_point
    from tuner.study.trials.search import MAX_BATCHED_TOKENS, MAX_NUM_SEQS, open_study, suggest
    from tuner.study.trials.sequential import ABBA, WRITE, sequential_plan
    from tuner.study.trials.significance import MIN_FRESH, beats, p_value, ratio, ratio_interval

_FACE = {
    "CAPACITY_OBJECTIVE": "tuner.study.setup.objective",
    "CONFIRMS_ATTR": "tuner.study.store.record",
    "CapacityFound": "tuner.study.capacity.rates",
    "CapacitySettings": "tuner.study.capacity.probes",
    "Criteria": "tuner.study.measure.scoring",
    "Dimension": "tuner.study.plan.spec",
    "Ended": "tuner.study.measure.trial",
    "Group": "tuner.study.trials.groups",
    "KV_ARGUMENTS": "tuner.study.plan.space",
    "LATENCY_OBJECTIVE": "tuner.study.setup.objective",
    "MAX_BATCHED_TOKENS": "tuner.study.trials.search",
    "MAX_NUM_SEQS": "tuner.study.trials.search",
    "MIN_FRESH": "tuner.study.trials.significance",
    "ABBA": "tuner.study.trials.sequential",
    "WRITE": "tuner.study.trials.sequential",
    "sequential_plan": "tuner.study.trials.sequential",
    "RatePoint": "tuner.study.capacity.rates",
    "RateSearch": "tuner.study.capacity.rate_search",
    "Run": "tuner.study.result.run",
    "SECTION": "tuner.study.plan.own_server",
    "SUSTAINED": "tuner.study.capacity.rates",
    "StartHint": "tuner.study.capacity.probes",
    "StudyObjective": "tuner.study.setup.objective",
    "StudySpec": "tuner.study.plan.spec",
    "TUNED": "tuner.study.result.choice",
    "Taken": "tuner.study.trials.incumbent",
    "TimeScale": "tuner.study.setup.calibrate",
    "TrialOutcome": "tuner.study.measure.trial",
    "TrialRecord": "tuner.study.store.record",
    "TrialSetup": "tuner.study.measure.trial",
    "Workload": "tuner.study.setup.prepare",
    "beats": "tuner.study.trials.significance",
    "choose": "tuner.study.result.choice",
    "finalist": "tuner.study.trials.confirm",
    "groups": "tuner.study.trials.groups",
    "levels": "tuner.study.trials.incumbent",
    "load_spec": "tuner.study.plan.spec",
    "measure_capacity": "tuner.study.capacity.probes",
    "measure_rate": "tuner.study.capacity.probes",
    "measured_on": "tuner.study.trials.fingerprint",
    "model_of": "tuner.study.setup.prepare",
    "next_point": "tuner.study.trials.incumbent",
    "of_spec": "tuner.study.setup.objective",
    "of_study": "tuner.study.setup.objective",
    "open_loop_replay": "tuner.study.setup.prepare",
    "open_study": "tuner.study.trials.search",
    "p_value": "tuner.study.trials.significance",
    "parse_server": "tuner.study.plan.own_server",
    "parse_spec": "tuner.study.plan.spec",
    "prepare": "tuner.study.setup.prepare",
    "rank": "tuner.study.trials.groups",
    "ratio": "tuner.study.trials.significance",
    "ratio_interval": "tuner.study.trials.significance",
    "reset_prefix_cache": "tuner.study.capacity.probes",
    "resolve": "tuner.study.result.run_config",
    "run_trial": "tuner.study.measure.trial",
    "runnable_baseline": "tuner.study.plan.space",
    "score": "tuner.study.measure.scoring",
    "search_capacity": "tuner.study.capacity.rates",
    "servers_for": "tuner.study.capacity.text",
    "suggest": "tuner.study.trials.search",
    "time_spent": "tuner.study.measure.time_spent",
    "wait_idle": "tuner.study.capacity.probes",
    "words_of": "tuner.study.result.words",
    "write_dummy_model": "tuner.study.setup.prepare",
}

__all__ = [
    "ABBA",
    "CAPACITY_OBJECTIVE",
    "CONFIRMS_ATTR",
    "KV_ARGUMENTS",
    "LATENCY_OBJECTIVE",
    "MAX_BATCHED_TOKENS",
    "MAX_NUM_SEQS",
    "MIN_FRESH",
    "SECTION",
    "SUSTAINED",
    "TUNED",
    "WRITE",
    "CapacityFound",
    "CapacitySettings",
    "Criteria",
    "Dimension",
    "Ended",
    "Group",
    "RatePoint",
    "RateSearch",
    "Run",
    "StartHint",
    "StudyObjective",
    "StudySpec",
    "Taken",
    "TimeScale",
    "TrialOutcome",
    "TrialRecord",
    "TrialSetup",
    "Workload",
    "beats",
    "choose",
    "finalist",
    "groups",
    "levels",
    "load_spec",
    "measure_capacity",
    "measure_rate",
    "measured_on",
    "model_of",
    "next_point",
    "of_spec",
    "of_study",
    "open_loop_replay",
    "open_study",
    "p_value",
    "parse_server",
    "parse_spec",
    "prepare",
    "rank",
    "ratio",
    "ratio_interval",
    "reset_prefix_cache",
    "resolve",
    "run_trial",
    "runnable_baseline",
    "score",
    "search_capacity",
    "sequential_plan",
    "servers_for",
    "suggest",
    "time_spent",
    "wait_idle",
    "words_of",
    "write_dummy_model",
]

__getattr__, __dir__ = lazy(__name__, _FACE)
