"""Reading trace files into a ``Trace``.

Each format is one parser, ``(path) -> Trace``, chosen by name or detected from the file's
first line. A malformed file raises ``TraceError`` naming the file and line; nothing else
escapes a parser.
"""

from __future__ import annotations

import csv
import itertools
import logging
import math
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

from tuner.errors import TraceError
from tuner.trace import Trace, from_columns

logger = logging.getLogger(__name__)

Parser = Callable[[Path], Trace]

CANONICAL_COLUMNS = ("timestamp", "input_tokens", "output_tokens")
AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


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
        raise ValueError(f"timestamp is neither a number nor a datetime: {text!r}") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def parse_tokens(text: str, column: str) -> int:
    """A positive whole token count."""
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{column} is not a number: {text!r}") from None
    if not math.isfinite(value) or value != int(value):
        raise ValueError(f"{column} is not a whole number: {text!r}")
    if value <= 0:
        raise ValueError(f"{column} must be positive, got {text.strip()}")
    return int(value)


def _csv_rows(path: Path, columns: tuple[str, ...]) -> Iterator[tuple[int, list[str]]]:
    """``(line, [value per column])`` for each data row of a CSV file with those columns."""
    with _open_text(path) as handle:
        reader = csv.reader(handle)
        try:
            header = next(reader, None)
        except csv.Error as exc:
            raise TraceError(str(path), 1, f"not a CSV file: {exc}") from None
        if header is None:
            raise TraceError(str(path), None, "the file is empty")
        header = [name.strip() for name in header]
        missing = [name for name in columns if name not in header]
        if missing:
            raise TraceError(
                str(path), 1, f"header lacks column(s) {', '.join(missing)}; found {header}"
            )
        index = [header.index(name) for name in columns]
        width = len(header)
        try:
            for row in reader:
                if not row:
                    continue
                if len(row) != width:
                    raise TraceError(
                        str(path), reader.line_num, f"expected {width} fields, found {len(row)}"
                    )
                yield reader.line_num, [row[i] for i in index]
        except csv.Error as exc:
            raise TraceError(str(path), reader.line_num, f"unreadable CSV: {exc}") from None


def _open_text(path: Path):
    try:
        raw = path.read_bytes()[:4096]
    except OSError as exc:
        raise TraceError(str(path), None, f"cannot read: {exc.strerror}") from None
    if b"\x00" in raw:
        raise TraceError(str(path), None, "binary data, not a text trace")
    return path.open(newline="", encoding="utf-8", errors="strict")


def _read_csv(path: Path, columns: tuple[str, str, str]) -> Trace:
    arrivals: list[float] = []
    inputs: list[int] = []
    outputs: list[int] = []
    rows = _csv_rows(path, columns)
    while True:
        try:
            line, (stamp, n_in, n_out) = next(rows)
        except StopIteration:
            break
        except UnicodeDecodeError:
            raise TraceError(str(path), len(arrivals) + 2, "not UTF-8 text") from None
        try:
            arrivals.append(parse_timestamp(stamp))
            inputs.append(parse_tokens(n_in, columns[1]))
            outputs.append(parse_tokens(n_out, columns[2]))
        except ValueError as exc:
            raise TraceError(str(path), line, str(exc)) from None
    if not arrivals:
        raise TraceError(str(path), None, "no requests after the header")
    _warn_if_unsorted(path, arrivals)
    return from_columns(arrivals, inputs, outputs, source=str(path))


def _warn_if_unsorted(path: Path, arrivals: list[float]) -> None:
    backwards = sum(1 for a, b in itertools.pairwise(arrivals) if b < a)
    if backwards:
        logger.warning("%s: %d timestamps go backwards; requests sorted by time", path, backwards)


def read_canonical_csv(path: Path) -> Trace:
    """``timestamp,input_tokens,output_tokens``; timestamps in seconds or as datetimes."""
    return _read_csv(path, CANONICAL_COLUMNS)


def read_azure_csv(path: Path) -> Trace:
    """Azure LLM inference trace: ``TIMESTAMP,ContextTokens,GeneratedTokens``."""
    return _read_csv(path, AZURE_COLUMNS)


PARSERS: dict[str, Parser] = {
    "canonical": read_canonical_csv,
    "azure": read_azure_csv,
}


def detect_format(path: Path) -> str:
    """The format name of a trace file, from its first line."""
    try:
        with path.open("rb") as handle:
            first = handle.readline(65536)
    except OSError as exc:
        raise TraceError(str(path), None, f"cannot read: {exc.strerror}") from None
    if not first.strip():
        raise TraceError(str(path), None if not first else 1, "the file is empty")
    header = {name.strip() for name in first.decode("utf-8", "replace").split(",")}
    if set(AZURE_COLUMNS) <= header:
        return "azure"
    if set(CANONICAL_COLUMNS) <= header:
        return "canonical"
    raise TraceError(
        str(path),
        1,
        "unknown trace format; expected a header with "
        f"{','.join(CANONICAL_COLUMNS)} or {','.join(AZURE_COLUMNS)}",
    )


def load_trace(path: str | Path, fmt: str | None = None) -> Trace:
    """Read a trace file, detecting its format unless ``fmt`` names one."""
    path = Path(path)
    if fmt is None:
        fmt = detect_format(path)
    try:
        parser = PARSERS[fmt]
    except KeyError:
        raise TraceError(
            str(path), None, f"unknown format {fmt!r}; known: {', '.join(PARSERS)}"
        ) from None
    return parser(path)
