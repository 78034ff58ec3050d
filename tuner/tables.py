"""Columns out of CSV and JSONL text, fast, with the file line of every failure.

A reading helper for ``tuner.formats``: it knows nothing of traces, only of named columns.
CSV files take a vectorised path (``numpy.loadtxt``) when they are plain (no quotes, one width);
anything else, or any value the fast path cannot read, goes through the ``csv`` module row by
row, which names the line that is wrong. JSONL files likewise: lines of one flat shape are read
as bytes with numpy (``tuner.jsonl_scan``), others with one ``json.loads``, and only the
line-by-line reader reports.
Every failure is a ``TraceError``.
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import math
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, NoReturn

import numpy as np

from tuner import jsonl_scan
from tuner.errors import TraceError

MAX_TRACE_BYTES = 512 * 1024 * 1024
"""Files larger than this are refused: reading one takes several GB of memory."""

Kind = Literal["time", "number", "text"]
IntLists = tuple[np.ndarray, np.ndarray]
"""Lists of integers, one per row, flat: ``(values, offsets)``, row ``i`` being
``values[offsets[i]:offsets[i + 1]]``."""


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


# --- CSV ---------------------------------------------------------------------------------


def _split_header(path: str, text: str) -> tuple[list[str], int, str]:
    """Header names, the header's line number, and the text after the header."""
    offset = 0
    number = 0
    while True:
        end = text.find("\n", offset)
        line = text[offset:] if end < 0 else text[offset:end]
        number += 1
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            break
        if end < 0:
            raise TraceError(path, None, "the file is empty")
        offset = end + 1
    try:
        header = next(csv.reader([line]))
    except csv.Error as exc:
        raise TraceError(path, number, f"unreadable CSV header: {exc}") from None
    body = "" if end < 0 else text[end + 1 :]
    return [name.strip() for name in header], number, body


def read_csv(path: str, text: str, wanted: Mapping[str, Kind]) -> Table:
    """The ``wanted`` columns (file column name → kind) of a CSV text with a header line."""
    header, header_line, body = _split_header(path, text)
    missing = [name for name in wanted if name not in header]
    if missing:
        raise TraceError(
            path,
            header_line,
            f"header lacks column(s) {', '.join(missing)}; found {','.join(header)[:200]}",
        )
    if len(set(header)) != len(header):
        raise TraceError(path, header_line, "header names a column twice")
    index = {name: header.index(name) for name in wanted}
    if not body.strip():
        raise TraceError(path, None, "no requests after the header")
    fast = _read_csv_fast(path, body, header_line, len(header), index, wanted)
    if fast is not None:
        return fast
    return _read_csv_rows(path, body, header_line, len(header), index, wanted)


def _load_columns(body: str, columns: Sequence[int], dtype: Any) -> np.ndarray:
    """Columns of a plain CSV body, one row per non-blank line, shape (rows, columns)."""
    return np.loadtxt(
        io.StringIO(body), delimiter=",", usecols=columns, dtype=dtype, comments=None, ndmin=2
    )


def _read_csv_fast(
    path: str,
    body: str,
    header_line: int,
    width: int,
    index: Mapping[str, int],
    wanted: Mapping[str, Kind],
) -> Table | None:
    """Vectorised read of a plain CSV body, or None where the row-by-row path must decide."""
    if '"' in body or "#" in body:
        return None
    data = np.frombuffer(body.encode(), dtype=np.uint8)
    ends = np.flatnonzero(data == ord("\n"))
    if len(data) and data[-1] != ord("\n"):
        ends = np.append(ends, len(data))
    starts = np.concatenate(([0], ends[:-1] + 1)).astype(np.int64)
    commas = np.flatnonzero(data == ord(","))
    del data
    per_line = np.searchsorted(commas, ends) - np.searchsorted(commas, starts)
    blank = ends == starts
    if np.any(per_line[~blank] != width - 1):
        return None
    rows = np.flatnonzero(~blank)
    if not len(rows) or np.any(blank[: rows[-1]]):
        # Whitespace-only lines and blank lines inside the body: let the csv module skip them.
        return None
    numbers = [name for name, kind in wanted.items() if kind == "number"]
    times = [name for name, kind in wanted.items() if kind == "time"]
    texts = [name for name, kind in wanted.items() if kind == "text"]
    columns: dict[str, np.ndarray] = {}
    try:
        try:  # one pass when the timestamps are plain numbers
            block = _load_columns(body, [index[n] for n in times + numbers], np.float64)
            columns |= {name: block[:, i] for i, name in enumerate(times + numbers)}
        except ValueError:
            if not times:
                raise
            block = _load_columns(body, [index[n] for n in numbers], np.float64)
            columns |= {name: block[:, i] for i, name in enumerate(numbers)}
            for name in times:
                columns[name] = datetimes_s(_load_columns(body, [index[name]], str)[:, 0])
        for name in texts:
            columns[name] = _load_columns(body, [index[name]], str)[:, 0]
    except ValueError:
        return None
    if any(len(values) != len(rows) for values in columns.values()):
        return None
    lines = header_line + 1 + rows
    return Table(path, columns, lambda row: int(lines[row]))


def _read_csv_rows(
    path: str,
    body: str,
    header_line: int,
    width: int,
    index: Mapping[str, int],
    wanted: Mapping[str, Kind],
) -> Table:
    values: dict[str, list[Any]] = {name: [] for name in wanted}
    lines: list[int] = []
    reader = csv.reader(io.StringIO(body), strict=True)
    try:
        for row in reader:
            line = header_line + reader.line_num
            if not row or (len(row) == 1 and not row[0].strip()):
                continue
            if len(row) != width:
                raise TraceError(path, line, f"expected {width} fields, found {len(row)}")
            for name, kind in wanted.items():
                cell = row[index[name]]
                try:
                    if kind == "time":
                        values[name].append(parse_timestamp(cell))
                    elif kind == "number":
                        values[name].append(parse_number(cell, name))
                    else:
                        values[name].append(cell.strip())
                except ValueError as exc:
                    raise TraceError(path, line, str(exc)) from None
            lines.append(line)
    except csv.Error as exc:
        raise TraceError(path, header_line + reader.line_num, f"unreadable CSV: {exc}") from None
    if not lines:
        raise TraceError(path, None, "no requests after the header")
    columns = {
        name: np.asarray(column, dtype=str if wanted[name] == "text" else np.float64)
        for name, column in values.items()
    }
    return Table(path, columns, lambda row: lines[row])


# --- JSONL -------------------------------------------------------------------------------


def jsonl_records(path: str, text: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line, object)`` for each non-blank line of a JSON Lines text."""
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as exc:
            message = f"not JSON: {exc}"
            raise TraceError(path, number, message) from None
        except RecursionError:
            raise TraceError(path, number, "not JSON: nested too deeply") from None
        if not isinstance(record, dict):
            raise TraceError(path, number, f"expected a JSON object, found {type(record).__name__}")
        yield number, record


def json_number(value: Any, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        if isinstance(value, str):
            return parse_number(value, key)
        raise ValueError(f"{key} is not a number: {str(value)[:40]!r}")
    return float(value)


def json_time(value: Any, key: str) -> float:
    if isinstance(value, str):
        return parse_timestamp(value)
    return json_number(value, key)


def json_int_list(value: Any, key: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value
    ):
        raise ValueError(f"{key} must be a list of non-negative integers")
    return tuple(value)


def read_jsonl(
    path: str,
    text: str,
    wanted: Mapping[str, Kind],
    lists: Sequence[str] = (),
    optional: Sequence[str] = (),
) -> tuple[Table, dict[str, IntLists]]:
    """The ``wanted`` keys of every record, and the integer-list keys named in ``lists``.

    Keys in ``optional`` may be absent (numbers become NaN, texts empty, lists empty). Each
    list key comes back flat, as ``IntLists``. Three readers, fastest first: lines of one flat
    shape (``_read_jsonl_scanned``), one ``json.loads`` of the whole file, then line by line,
    which alone reports errors. The first two give up (None) on anything they do not expect.
    """
    return (
        _read_jsonl_scanned(path, text, wanted, lists, optional)
        or _read_jsonl_fast(path, text, wanted, lists)
        or _read_jsonl_rows(path, text, wanted, lists, optional)
    )


def _read_jsonl_rows(
    path: str,
    text: str,
    wanted: Mapping[str, Kind],
    lists: Sequence[str],
    optional: Sequence[str],
) -> tuple[Table, dict[str, IntLists]]:
    """``read_jsonl``, one ``json.loads`` per line: exact, and names the line that is wrong."""
    values: dict[str, list[Any]] = {name: [] for name in wanted}
    list_values: dict[str, list[tuple[int, ...]]] = {name: [] for name in lists}
    lines: list[int] = []
    for line, record in jsonl_records(path, text):
        try:
            for name, kind in wanted.items():
                if name not in record:
                    if name not in optional:
                        raise ValueError(f"lacks the key {name!r}")
                    values[name].append("" if kind == "text" else math.nan)
                elif kind == "time":
                    values[name].append(json_time(record[name], name))
                elif kind == "number":
                    values[name].append(json_number(record[name], name))
                else:
                    values[name].append(str(record[name]))
            for name in lists:
                if name not in record and name in optional:
                    list_values[name].append(())
                else:
                    list_values[name].append(json_int_list(record.get(name), name))
        except ValueError as exc:
            raise TraceError(path, line, str(exc)) from None
        lines.append(line)
    if not lines:
        raise TraceError(path, None, "no records")
    columns = {
        name: np.asarray(column, dtype=str if wanted[name] == "text" else np.float64)
        for name, column in values.items()
    }
    flat = {name: int_lists(rows) for name, rows in list_values.items()}
    return Table(path, columns, lambda row: lines[row]), flat


def int_lists(rows: Sequence[Sequence[int]]) -> IntLists:
    """``rows`` of integers, flat; ids beyond int64 are kept exact, as Python ints."""
    offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum([len(row) for row in rows], out=offsets[1:])
    flat = list(itertools.chain.from_iterable(rows))
    try:
        return np.array(flat, dtype=np.int64), offsets
    except OverflowError:
        return np.array(flat, dtype=object), offsets


def _numbers(values: list[Any], kinds: str) -> np.ndarray | None:
    """``values`` as a 1-D array if numpy reads them all as one of ``kinds``, else None."""
    try:
        array = np.array(values)
    except ValueError:  # lists of unequal lengths among the values
        return None
    return array if array.ndim == 1 and array.dtype.kind in kinds else None


def _read_jsonl_fast(
    path: str, text: str, wanted: Mapping[str, Kind], lists: Sequence[str]
) -> tuple[Table, dict[str, IntLists]] | None:
    """One ``json.loads`` for the whole file and column-wise checks, for the common case.

    None whenever anything is unusual (a line that is not JSON, a missing key, a string where a
    number belongs, a bad list, any true/false/null, whose numpy reading would hide them): the
    line-by-line reader then handles it and names the line.
    """
    if "true" in text or "false" in text or "null" in text:
        return None
    lines = text.split("\n")
    numbers = [n for n, line in enumerate(lines, start=1) if line.strip()]
    if not numbers:
        return None
    try:
        records = json.loads("[" + ",".join(lines[n - 1] for n in numbers) + "]")
    except (ValueError, RecursionError):
        return None
    del lines
    if not all(type(r) is dict for r in records):
        return None
    columns: dict[str, np.ndarray] = {}
    list_values: dict[str, IntLists] = {}
    try:
        for name, kind in wanted.items():
            column = [r[name] for r in records]
            if kind == "text":
                columns[name] = np.asarray([str(v) for v in column], dtype=str)
                continue
            array = _numbers(column, "iuf")
            if array is None:
                return None
            columns[name] = array.astype(np.float64)
        for name in lists:
            column = [r[name] for r in records]
            if not all(type(v) is list for v in column):
                return None
            flat = list(itertools.chain.from_iterable(column))
            ids = _numbers(flat, "i") if flat else np.zeros(0, dtype=np.int64)
            if ids is None or (len(ids) and ids.min() < 0):
                return None
            offsets = np.zeros(len(column) + 1, dtype=np.int64)
            np.cumsum([len(v) for v in column], out=offsets[1:])
            list_values[name] = (ids.astype(np.int64), offsets)
    except KeyError:
        return None
    return Table(path, columns, lambda row: numbers[row]), list_values


def _read_jsonl_scanned(
    path: str,
    text: str,
    wanted: Mapping[str, Kind],
    lists: Sequence[str],
    optional: Sequence[str],
    chunk_chars: int = jsonl_scan.SCAN_CHARS,
) -> tuple[Table, dict[str, IntLists]] | None:
    """Every line a flat object with the first line's plain keys in the same order, holding
    numbers and lists of numbers: read ``chunk_chars`` at a time (in whole lines), fast. None
    on anything else."""
    shape = jsonl_scan.Shape.of(text)
    if shape is None:
        return None
    parts: list[tuple[dict[str, np.ndarray], dict[str, IntLists]]] = []
    lines: list[np.ndarray] = []
    begin = line = 0
    while begin < len(text):
        end = text.find("\n", begin + chunk_chars)
        end = len(text) if end < 0 else end + 1
        chunk = jsonl_scan.read_chunk(text[begin:end].encode(), shape)
        if chunk is None:
            return None
        if chunk.rows:
            part = jsonl_scan.scanned_columns(chunk, shape, wanted, lists, optional)
            if part is None:
                return None
            parts.append(part)
            lines.append(chunk.row_lines + line + 1)
        line += chunk.newlines
        begin = end
    if not parts:
        return None
    columns = {name: np.concatenate([p[0][name] for p in parts]) for name in wanted}
    list_values = {name: jsonl_scan.concatenate([p[1][name] for p in parts]) for name in lists}
    numbers = np.concatenate(lines)
    return Table(path, columns, lambda row: int(numbers[row])), list_values
