"""Exit codes of the ``tuner`` command line.

``tuner run``: what the configuration written is (``tuner.study.result.choice``): a searched one
that meets the SLOs and beats the baseline (vLLM's defaults, or the spec's) beyond chance on
fresh engines (0); the baseline, kept because it meets the SLOs and nothing searched beat it
beyond chance (4); a searched one that meets the SLOs where the baseline did not, with no test
on fresh engines behind it, or the closest configuration, where none met the SLOs (3); nothing,
as no trial served (1). Then bad input or usage (2), and Ctrl-C or SIGTERM (130).
The other commands exit 0, 1 or 2 alike.
"""

EXIT_MEETS_SLOS = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_MISSES_SLOS = 3
EXIT_DEFAULTS_KEPT = 4
# A configuration that meets the SLOs was written: a tuned one, or vLLM's defaults kept.
MEETS_SLOS_EXITS = (EXIT_MEETS_SLOS, EXIT_DEFAULTS_KEPT)
EXIT_INTERRUPTED = 130
