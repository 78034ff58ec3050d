"""Exit codes of the ``tuner`` command line.

``tuner run``: a configuration was written that meets the SLOs (0), or one that misses them, the
closest trial (3), or nothing was written (1). Then bad input or usage (2), and Ctrl-C or
SIGTERM (130). The other commands exit 0, 1 or 2 alike.
"""

EXIT_MEETS_SLOS = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_MISSES_SLOS = 3
EXIT_INTERRUPTED = 130
