"""Names of the user attributes tuner sets on a study's trials (what optuna-dashboard shows)."""

BASELINE_ATTR = "baseline"
CANDIDATE_ATTR = "candidate"
ARGS_ATTR = "engine_args"
REASON_ATTR = "reason"
LOG_ATTR = "log_tail"
FEASIBLE_ATTR = "feasible"
# A re-measurement of the winner (tuner.study.trials.confirm): the number of the trial it repeats.
CONFIRMS_ATTR = "confirms"
# Why the incumbent search proposed a trial (tuner.study.trials.incumbent).
MOVE_ATTR = "move"
