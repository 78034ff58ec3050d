"""The ``tuner`` command line: ``tuner run``, ``tuner trace``, ``tuner compile-key``."""

from tuner.cli.main import main

__all__ = ["main"]
