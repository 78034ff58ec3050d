"""Reading trace files of every format users bring into a ``Trace``.

``decide_format`` is the one place a file's format is decided: named, implied by a column
mapping, or detected from the file's header (CSV) or first record's keys (JSONL). The parsers
live in ``tuner.traces.parsers``. Files over ``MAX_TRACE_BYTES`` are refused.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from tuner.errors import TraceError
from tuner.traces.model import Trace
from tuner.traces.parsers import (
    AZURE_COLUMNS,
    BAILIAN_KEYS,
    BURSTGPT_COLUMNS,
    CANONICAL_COLUMNS,
    CONCURRENCY_COLUMNS,
    ROLES,
    Parser,
    TraceOptions,
    read_azure_csv,
    read_bailian,
    read_burstgpt,
    read_canonical,
    read_mapped,
    read_mooncake,
)
from tuner.traces.table import MAX_TRACE_BYTES, first_record_line


def parse_column_mapping(text: str) -> dict[str, str]:
    """``timestamp=ts,input_tokens=prompt_len,output_tokens=gen_len`` as a dict."""
    mapping: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        role, sep, column = item.partition("=")
        role, column = role.strip(), column.strip()
        if not sep or not column or role not in ROLES:
            raise ValueError(f"bad column mapping {item!r}; use ROLE=COLUMN with ROLE in {ROLES}")
        mapping[role] = column
    missing = [role for role in CANONICAL_COLUMNS if role not in mapping]
    if missing:
        raise ValueError(f"column mapping lacks {', '.join(missing)}")
    return mapping


PARSERS: dict[str, Parser] = {
    "canonical": read_canonical,
    "azure": read_azure_csv,
    "mooncake": read_mooncake,
    "burstgpt": read_burstgpt,
    "bailian": read_bailian,
    "columns": read_mapped,
}

CONCURRENCY = "concurrency"
FORMATS = (*PARSERS, CONCURRENCY)
"""Every format name: the request-trace formats, then the concurrency trace."""


def decide_format(
    path: Path, fmt: str | None = None, columns: Mapping[str, str] | None = None
) -> str:
    """The format of ``path``: ``fmt`` if given, ``columns`` if a mapping is, else detected.

    A mapping beside a named format other than ``columns`` contradicts it and is refused.
    """
    if fmt is not None and fmt not in FORMATS:
        raise TraceError(str(path), None, f"unknown format {fmt!r}; known: {', '.join(FORMATS)}")
    if columns and fmt not in (None, "columns"):
        raise TraceError(str(path), None, f"a column mapping is for the columns format, not {fmt}")
    if fmt is not None:
        return fmt
    return "columns" if columns else detect_format(path)


def detect_format(path: Path) -> str:
    """The format name of a trace file, from its CSV header or its first JSON record's keys.

    Returns ``"concurrency"`` for a ``timestamp,concurrency`` CSV (not a request trace).
    """
    try:
        with path.open("rb") as handle:
            head = handle.read(1 << 16)
    except OSError as exc:
        raise TraceError(str(path), None, f"cannot read: {exc.strerror or exc}") from None
    text = head.decode("utf-8", "replace").removeprefix("\ufeff").replace("\r", "\n")
    number, line = first_record_line(str(path), text)
    if line.lstrip().startswith("{"):
        try:
            keys = set(json.loads(line))
        except (ValueError, TypeError, RecursionError):
            raise TraceError(str(path), number, "first record is not a JSON object") from None
        if set(BAILIAN_KEYS) <= keys or {"chat_id", "turn"} <= keys:
            return "bailian"
        if {"timestamp", "input_length", "output_length"} <= keys:
            return "mooncake"
        if set(CANONICAL_COLUMNS) <= keys:
            return "canonical"
        found = ",".join(sorted(keys))[:200]
    else:
        header = {name.strip() for name in line.split(",")}
        if set(AZURE_COLUMNS) <= header:
            return "azure"
        if set(BURSTGPT_COLUMNS) - {"Model"} <= header:
            return "burstgpt"
        if set(CANONICAL_COLUMNS) <= header:
            return "canonical"
        if set(CONCURRENCY_COLUMNS) <= header:
            return CONCURRENCY
        found = line.strip()[:200]
    raise TraceError(
        str(path),
        number,
        f"unknown trace format (found {found!r}); expected {','.join(CANONICAL_COLUMNS)}, "
        f"Azure, BurstGPT, Mooncake or Bailian columns, or give --format columns --columns ...",
    )


def load_trace(
    path: str | Path,
    fmt: str | None = None,
    *,
    columns: Mapping[str, str] | None = None,
    time_unit: str = "s",
    model: str | None = None,
    block_tokens: int = 0,
    max_bytes: int = MAX_TRACE_BYTES,
) -> Trace:
    """Read a request trace file in the format ``decide_format`` gives.

    A column mapping without ``fmt`` means the ``columns`` format.
    """
    path = Path(path)
    fmt = decide_format(path, fmt, columns)
    if fmt == CONCURRENCY:
        raise TraceError(
            str(path),
            None,
            "a concurrency trace (timestamp,concurrency), not a request trace; "
            "it is replayed closed-loop with lengths from a request trace",
        )
    options = TraceOptions(dict(columns or {}), time_unit, model, block_tokens, max_bytes)
    return PARSERS[fmt](path, options)
