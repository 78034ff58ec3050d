"""Named columns read from a trace file, and the pieces every reader shares.

Knows nothing of traces: a ``Table`` is columns with a way back from a row to its file line, so
that every failure (a ``TraceError``) names the line. The CSV and JSONL readers
(``tuner.traces.csv_reader``, ``tuner.traces.jsonl_reader``) build tables from a trace's text
(``tuner.traces.source``); timestamps and numbers are parsed here, alike for both.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal, NoReturn

import numpy as np

from tuner.errors import TraceError

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


MAX_SPAN_S = 366 * 86400.0
"""The longest time a trace may span: past a year, its times are in another unit than the one
they are read in (milliseconds or nanoseconds read as seconds), or corrupt."""


def timestamps(table: Table, column: str, units_per_s: float = 1.0) -> np.ndarray:
    """``column`` of ``table`` in seconds (its values divided by ``units_per_s``), checked as
    timestamps: finite, not negative (they count up from 0, or are datetimes from 1970 on) and
    within ``MAX_SPAN_S`` of the earliest; the first row that is not names its line."""
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
    seconds = values / units_per_s if units_per_s != 1.0 else values
    if len(seconds) and seconds.max() - seconds.min() > MAX_SPAN_S:
        row, first = int(np.argmax(seconds)), float(values.min())
        table.fail(
            row,
            f"{column} {values[row]:.12g} is more than a year after the earliest ({first:.12g}): "
            "times in another unit than the one read (ms or ns as seconds?); "
            "--format columns --time-unit names the unit",
        )
    return seconds


def first_record_line(path: str, text: str) -> tuple[int, str]:
    """``(line number, line)`` of the first line that is neither blank nor a ``#`` comment."""
    for number, line in enumerate(text.split("\n", 1000), start=1):
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            return number, line
    raise TraceError(path, None, "the file is empty (no data lines)")
