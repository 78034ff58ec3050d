"""CSV text as a ``Table``, fast, with the file line of every failure.

Plain files (no quotes, one width) take a vectorised path (``numpy.loadtxt``); anything else, or
any value the fast path cannot read, goes through the ``csv`` module row by row, which names the
line that is wrong.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tuner.errors import TraceError
from tuner.traces.table import Kind, Table, datetimes_s, parse_number, parse_timestamp


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
