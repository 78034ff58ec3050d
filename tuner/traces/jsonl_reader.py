"""JSON Lines text as a ``Table``, fast, with the file line of every failure.

Lines of one flat shape are read as bytes with numpy (``tuner.traces.jsonl_scan``), others with
one ``json.loads``; only the line-by-line reader reports, naming the line that is wrong.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from tuner.errors import TraceError
from tuner.traces import jsonl_scan
from tuner.traces.model import IntLists, int_lists
from tuner.traces.table import Kind, Table, parse_number, parse_timestamp


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
    """A JSON value (number, or a number in a string) as a float; ``ValueError`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        if isinstance(value, str):
            return parse_number(value, key)
        raise ValueError(f"{key} is not a number: {str(value)[:40]!r}")
    return float(value)


def json_time(value: Any, key: str) -> float:
    """A JSON time: a timestamp string, or a number as the trace gives it."""
    if isinstance(value, str):
        return parse_timestamp(value)
    return json_number(value, key)


def json_int_list(value: Any, key: str) -> tuple[int, ...]:
    """A JSON list of non-negative integers (such as block hash ids) as a tuple."""
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
    # Each line wrapped in its own array, the wrappers joined by a newline: a string cannot
    # hold a raw newline, and a line whose value ran on into the next, or held two, would
    # leave a wrapper that is not one object alone (joined by a bare comma, a key broken over
    # two lines read as one record).
    try:
        wrapped = json.loads("[[" + "],\n[".join(lines[n - 1] for n in numbers) + "]]")
    except (ValueError, RecursionError):
        return None
    del lines
    if len(wrapped) != len(numbers) or not all(len(w) == 1 for w in wrapped):
        return None
    records = [w[0] for w in wrapped]
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
