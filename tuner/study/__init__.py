"""The study: its spec and search space, one measured trial, scoring against the SLOs, the
search (the only Optuna code), and the configuration written out."""
