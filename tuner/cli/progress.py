"""The live status line of ``tuner run``: where the running trial is, rewritten in place.

Only on a terminal. On anything else (a CI log, a file, a pipe) it writes nothing, and ``tuner
run`` prints one plain line as each trial starts and one when it ends. The line is cut to the
terminal's width, so that a carriage return always goes back to its start.
"""

from __future__ import annotations

import logging
import shutil
from typing import TextIO

from tuner.study.measure.trial import RATE, REPLAY, STARTING, WARMUP, TrialProgress

# Back to the start of the line, and erase it.
ERASE_LINE = "\r\x1b[2K"


def describe(progress: TrialProgress) -> str:
    """``replay 12/60 s, 140/720 done, TTFT p95 1234 ms``; ``starting vLLM 34 s``."""
    p = progress
    if p.phase == STARTING:
        return f"{p.phase} {p.elapsed_s:.0f} s"
    if p.phase not in (REPLAY, WARMUP) and not p.phase.startswith(RATE):
        return p.phase
    if p.sending_s is None:
        seconds = f"{p.elapsed_s:.0f} s"
    elif p.elapsed_s <= p.sending_s:
        seconds = f"{p.elapsed_s:.0f}/{p.sending_s:.0f} s"
    else:
        seconds = f"{p.elapsed_s:.0f} s (all sent by {p.sending_s:.0f} s, finishing)"
    done = f"{p.done}/{p.total} done" if p.total is not None else f"{p.done} done"
    ttft = "-" if p.ttft_p95_s is None else f"{p.ttft_p95_s * 1000:.0f} ms"
    return f"{p.phase} {seconds}, {done}, TTFT p95 {ttft}"


class StatusLine:
    """One line of a terminal, rewritten as the running trial moves on."""

    def __init__(self, stream: TextIO, columns: int | None = None) -> None:
        self.stream = stream
        self.live = stream.isatty()
        self.columns = columns
        self._head = ""
        self._tail = ""
        self._shown = ""

    def begin(self, number: int, params: str) -> None:
        """A new trial: its number heads the line, its engine arguments end it."""
        self._head = f"trial {number:>3}"
        self._tail = params

    def show(self, progress: TrialProgress) -> None:
        if not self.live:
            return
        text = f"{self._head}  {describe(progress)}  {self._tail}"
        width = (self.columns or shutil.get_terminal_size().columns) - 1
        text = text[: max(width, 1)]
        if text == self._shown:
            return
        self.stream.write(ERASE_LINE + text)
        self.stream.flush()
        self._shown = text

    def clear(self) -> None:
        """Erase the line, so that what is printed next starts on a clean line."""
        if self._shown:
            self.stream.write(ERASE_LINE)
            self.stream.flush()
            self._shown = ""

    def keep(self) -> None:
        """Leave the line as it is (where a run stopped) and move below it."""
        if self._shown:
            self.stream.write("\n")
            self.stream.flush()
            self._shown = ""

    def before_log(self, record: logging.LogRecord) -> bool:
        """A logging filter: clears the line before a record is written; keeps every record."""
        self.clear()
        return True
