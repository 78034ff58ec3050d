"""A study's trials in Optuna: its storage (``storage``), the search that asks for trials and
records them (``search``, ``incumbent``, ``references``), the tuner processes that add them
(``workers``), which to show (``picks``), configurations and their re-measurements (``groups``,
``confirm``) and what a study was measured on (``fingerprint``)."""
