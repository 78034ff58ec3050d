"""Named columns read from a trace file, and the pieces every reader shares.

Knows nothing of traces: a ``Table`` is columns with a way back from a row to its file line, so
that every failure (a ``TraceError``) names the line. ``read_text`` takes a file in whole; the
CSV and JSONL readers (``tuner.traces.csv_reader``, ``tuner.traces.jsonl_reader``) build tables
from its text; timestamps and numbers are parsed here, alike for both.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal, NoReturn

import numpy as np

from tuner.errors import TraceError

MAX_TRACE_BYTES = 512 * 1024 * 1024
"""Files larger than this are refused: reading one takes several GB of memory."""

Kind = Literal["time", "number", "text"]


def parse_timestamp(text: str) -> float:
    """Seconds, as a number or as an ISO 8601 datetime (naive datetimes are taken as UTC).

    Accepts the three styles of the Azure traces: ``2023-11-16 18:17:03.9799600``,
    ``2024-05-10 00:00:00.009930+00:00`` and ``2024-10-15T12:00:00.269Z``.
    """
    text = text.strip()
    try:
        value = float(text)
    except ValueError:
        pass
    else:
        if not math.isfinite(value):
            raise ValueError(f"timestamp is not a finite number: {text!r}")
        return value
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"timestamp is neither a number nor a datetime: {text[:40]!r}") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def datetimes_s(texts: np.ndarray) -> np.ndarray:
    """``parse_timestamp`` of an array of strings, vectorised for one zone style per file.

    numpy parses naive ISO datetimes (space or ``T``, up to 9 fractional digits) in C; a
    ``Z`` or ``+00:00`` shared by every value is removed first. Anything else (other
    offsets, mixed styles, values numpy rejects) is parsed one by one.
    """
    texts = np.strings.strip(texts)
    for suffix in ("Z", "+00:00"):
        if len(texts) and np.all(np.strings.endswith(texts, suffix)):
            texts = np.strings.replace(texts, suffix, "")
            break
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # numpy warns on, then guesses, other offsets
            moments = texts.astype("datetime64[ns]")
    except (ValueError, UserWarning):
        moments = None
    if moments is None or np.any(np.isnat(moments)):
        return np.fromiter((parse_timestamp(t) for t in texts), np.float64, count=len(texts))
    return (moments - np.datetime64(0, "ns")).astype(np.int64) / 1e9


def parse_number(text: str, column: str) -> float:
    """A cell as a number; ``ValueError`` naming the column otherwise."""
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"{column} is not a number: {text[:40]!r}") from None


@dataclass(frozen=True)
class Table:
    """Named columns read from a file, and a way back from a row to its line."""

    path: str
    columns: Mapping[str, np.ndarray]
    line_of: Callable[[int], int]

    def __len__(self) -> int:
        return len(next(iter(self.columns.values()))) if self.columns else 0

    def fail(self, row: int, message: str) -> NoReturn:
        raise TraceError(self.path, self.line_of(row), message)


def timestamps(table: Table, column: str) -> np.ndarray:
    """``column`` of ``table``, checked as timestamps: finite and not negative (they count up
    from 0, or are datetimes from 1970 on); the first row that is not names its line."""
    values = table.columns[column]
    bad = ~np.isfinite(values)
    if np.any(bad):
        table.fail(int(np.argmax(bad)), f"{column} is not a finite number")
    negative = values < 0
    if np.any(negative):
        row = int(np.argmax(negative))
        table.fail(
            row,
            f"{column} is negative ({values[row]:g}): timestamps count up from 0 "
            "(or are datetimes from 1970 on)",
        )
    return values


def read_text(path: Path, max_bytes: int = MAX_TRACE_BYTES) -> str:
    """The whole file as text with ``\\n`` line ends; refuses huge, binary and non-UTF-8 files."""
    try:
        size = path.stat().st_size
        if size > max_bytes:
            raise TraceError(
                str(path),
                None,
                f"{size / 2**20:.0f} MiB is over the {max_bytes / 2**20:.0f} MiB limit on "
                "trace files; cut the hours you want to tune for into a smaller file",
            )
        raw = path.read_bytes()
    except OSError as exc:
        raise TraceError(str(path), None, f"cannot read: {exc.strerror or exc}") from None
    zero = raw.find(b"\x00")
    if zero >= 0:
        line = raw.count(b"\n", 0, zero) + 1
        raise TraceError(str(path), line, "binary data (a NUL byte), not a text trace")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise TraceError(str(path), line, "not UTF-8 text") from None
    text = text.removeprefix("\ufeff")
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    if not text or text.isspace():  # (not text.strip(), without copying the text)
        raise TraceError(str(path), None, "the file is empty")
    return text


def first_record_line(path: str, text: str) -> tuple[int, str]:
    """``(line number, line)`` of the first line that is neither blank nor a ``#`` comment."""
    for number, line in enumerate(text.split("\n", 1000), start=1):
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            return number, line
    raise TraceError(path, None, "the file is empty (no data lines)")
