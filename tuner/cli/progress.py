"""What ``tuner run`` prints as it runs (``RunLines``): its lines, and of each trial a live status
line (``StatusLine``), where the running trial is, rewritten in place.

The status line only on a terminal. On anything else (a CI log, a file, a pipe) it writes
nothing, and ``tuner run`` prints one plain line as each trial starts and one when it ends. The
line is cut to the terminal's width, so that a carriage return always goes back to its start.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import sys
from collections.abc import Iterator, Mapping
from typing import Any, TextIO

from optuna.trial import FrozenTrial

from tuner.cli.result import fmt_params, trial_line
from tuner.engine.handle import ServerHandle
from tuner.engine.own_server import OWN_SERVER_NAME
from tuner.engine.process import Engine
from tuner.study.measure.trial import RATE, REPLAY, STARTING, WARMUP, OnProgress, TrialProgress
from tuner.study.plan.spec import StudySpec

# Back to the start of the line, and erase it.
ERASE_LINE = "\r\x1b[2K"


def describe(progress: TrialProgress, server: str = "vLLM") -> str:
    """``replay 12/60 s, 140/720 done, TTFT p95 1234 ms``; ``starting vLLM 34 s``, the server
    named ``server``."""
    p = progress
    if p.phase == STARTING:
        return f"{p.phase} {server} {p.elapsed_s:.0f} s"
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

    def __init__(self, stream: TextIO, columns: int | None = None, server: str = "vLLM") -> None:
        self.stream = stream
        self.live = stream.isatty()
        self.columns = columns
        self.server = server
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
        text = f"{self._head}  {describe(progress, self.server)}  {self._tail}"
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


class RunLines:
    """What ``tuner run`` prints of a run (a ``tuner.study.result.run.Teller``): its lines as
    they come; of each trial, on a terminal a live line while it runs, elsewhere one line as it
    starts, once its server has been launched (``ServerHandle.launched``): ``trial   3
    max-num-seqs=12  starting vLLM (pid 4321) ...`` (that pid is also the server's process
    group; "your server" where the study starts the user's own); a summary line as each ends."""

    def __init__(self, spec: StudySpec) -> None:
        # vLLM's OpenAI server, or the user's own (``--server-command``).
        self.server = Engine.server_name if spec.server is None else OWN_SERVER_NAME
        self.status = StatusLine(sys.stdout, server=self.server)
        self.progress: OnProgress | None = self.status.show if self.status.live else None
        # What a trial's line names: the searched arguments, and what the baseline and the
        # candidates set beyond the fixed ones (a candidate {api-server-count: 2} is not the
        # defaults).
        set_by = [*spec.baseline, *(name for candidate in spec.candidates for name in candidate)]
        self.names = list(dict.fromkeys([*(d.name for d in spec.space), *set_by]))
        # The trial starting and its engine arguments, until its start line is printed.
        self._starting: tuple[int, str] | None = None

    def say(self, line: str) -> None:
        print(line, flush=True)

    def trial_started(self, number: int, engine_args: Mapping[str, Any]) -> None:
        params = fmt_params(engine_args, self.names)
        if self.status.live:
            self.status.begin(number, params)
        else:
            self._starting = (number, params)

    def engine_started(self, server: ServerHandle) -> None:
        """Off a terminal, the start line, now that the trial's server has been launched."""
        if self._starting is not None:
            (number, params), self._starting = self._starting, None
            print(f"trial {number:>3}  {params}  {server.launched()} ...", flush=True)

    def trial_finished(self, trial: FrozenTrial) -> None:
        self.status.clear()
        print(trial_line(trial, self.names), flush=True)

    @contextlib.contextmanager
    def showing(self) -> Iterator[None]:
        """While trials run: a log record clears the live line first; at the end, or where the
        run stopped (interrupted), the line stays as it is, showing where the trial was."""
        handlers = logging.getLogger().handlers
        for handler in handlers:
            handler.addFilter(self.status.before_log)
        try:
            yield
        finally:
            self.status.keep()
            for handler in handlers:
                handler.removeFilter(self.status.before_log)
