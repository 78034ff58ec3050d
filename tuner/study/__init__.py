"""The study, in four floors, each importing only from those below it: its plan (``plan``: the
spec and the search space), one trial measured and judged (``measure``: the trial, the capacity
search, scoring, the objective), the study's trials in Optuna (``trials``: storage, the
search, confirmation) and what it answers (``result``: the configuration chosen and written)."""
