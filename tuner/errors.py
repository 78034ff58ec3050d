"""The tool's own errors.

Failures of the thing being tuned (a vLLM configuration that crashes, a request that errors)
are data, recorded in the study. These exceptions are failures of the tool or of its input.
"""

from __future__ import annotations


class TunerError(Exception):
    """A failure of the tool itself: the command line exits with status 1."""


class InputError(TunerError):
    """Bad input or usage (a trace, a study spec, an argument): exit status 2."""


class TraceError(InputError):
    """A trace file that cannot be read, with the file and line where it went wrong."""

    def __init__(self, path: str, line: int | None, message: str) -> None:
        self.path = path
        self.line = line
        self.reason = message
        where = f"{path}:{line}" if line is not None else path
        super().__init__(f"{where}: {message}")


class SpecError(InputError):
    """A study spec that does not validate; the message names the field."""

    def __init__(self, path: str, field: str, message: str) -> None:
        self.path = path
        self.field = field
        super().__init__(f"{path}: {field}: {message}")
