"""Reading trace files of every format users bring into a ``Trace``.

``decide_format`` is the one place a file's format is decided: named, implied by a column
mapping, or detected from the file's header (CSV) or first record's keys (JSONL). The parsers
live in ``tuner.traces.parsers``. Each takes a trace as read once (``tuner.traces.source``):
a path given here is read once, and its text serves detection and parsing alike. Traces over
``MAX_TRACE_BYTES`` are refused.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
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
from tuner.traces.source import MAX_TRACE_BYTES, TraceText, as_source
from tuner.traces.table import first_record_line


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
    source: TraceText | str | Path,
    fmt: str | None = None,
    columns: Mapping[str, str] | None = None,
) -> str:
    """The format of ``source``: ``fmt`` if given, ``columns`` if a mapping is, else detected
    (a path is then read: pass the ``TraceText`` where its text is read again).

    A mapping beside a named format other than ``columns`` contradicts it and is refused.
    """
    name = source.name if isinstance(source, TraceText) else str(source)
    if fmt is not None and fmt not in FORMATS:
        raise TraceError(name, None, f"unknown format {fmt!r}; known: {', '.join(FORMATS)}")
    if columns and fmt not in (None, "columns"):
        raise TraceError(name, None, f"a column mapping is for the columns format, not {fmt}")
    if fmt is not None:
        return fmt
    return "columns" if columns else detect_format(source)


@dataclass(frozen=True)
class Signature:
    """How one format is recognised: its first JSON record's keys (``jsonl``) or its CSV
    header's columns (``csv``) hold one of the sets in ``keys``. ``label`` and ``shown`` (its
    first set of keys) name it in the error for a file of no known format."""

    fmt: str
    record: str  # "csv" or "jsonl"
    keys: tuple[frozenset[str], ...]
    label: str

    def matches(self, record: str, found: set[str]) -> bool:
        return record == self.record and any(keys <= found for keys in self.keys)

    @property
    def shown(self) -> str:
        return ",".join(sorted(self.keys[0]))


# Tried in this order; the first match decides. A Bailian record is recognised by its own keys
# or by a conversation's (chat_id, turn); a BurstGPT header may lack its Model column.
SIGNATURES = (
    Signature(
        "bailian", "jsonl", (frozenset(BAILIAN_KEYS), frozenset({"chat_id", "turn"})), "Bailian"
    ),
    Signature(
        "mooncake",
        "jsonl",
        (frozenset({"timestamp", "input_length", "output_length"}),),
        "Mooncake",
    ),
    Signature("canonical", "jsonl", (frozenset(CANONICAL_COLUMNS),), "canonical JSONL"),
    Signature("azure", "csv", (frozenset(AZURE_COLUMNS),), "Azure"),
    Signature("burstgpt", "csv", (frozenset(BURSTGPT_COLUMNS) - {"Model"},), "BurstGPT"),
    Signature("canonical", "csv", (frozenset(CANONICAL_COLUMNS),), "canonical CSV"),
    Signature(CONCURRENCY, "csv", (frozenset(CONCURRENCY_COLUMNS),), "concurrency"),
)


def detect_format(source: TraceText | str | Path) -> str:
    """The format name of a trace, from its CSV header or its first JSON record's keys, as the
    first of ``SIGNATURES`` that matches.

    Returns ``"concurrency"`` for a ``timestamp,concurrency`` CSV (not a request trace).
    """
    source = as_source(source)
    path = source.name
    number, line = first_record_line(path, source.text)
    if line.lstrip().startswith("{"):
        record = "jsonl"
        try:
            found = set(json.loads(line))
        except (ValueError, TypeError, RecursionError):
            raise TraceError(path, number, "first record is not a JSON object") from None
        shown = ",".join(sorted(found))[:200]
    else:
        record = "csv"
        found = {name.strip() for name in line.split(",")}
        shown = line.strip()[:200]
    for signature in SIGNATURES:
        if signature.matches(record, found):
            return signature.fmt
    known = "; ".join(f"{s.label} ({s.shown})" for s in SIGNATURES)
    raise TraceError(
        path,
        number,
        f"unknown trace format (found {shown!r}); known: {known}; or give --format columns "
        "--columns ...",
    )


def load_trace(
    source: TraceText | str | Path,
    fmt: str | None = None,
    *,
    columns: Mapping[str, str] | None = None,
    time_unit: str = "s",
    model: str | None = None,
    block_tokens: int = 0,
    max_bytes: int = MAX_TRACE_BYTES,
) -> Trace:
    """A request trace (a path, read once, or its text as read) in the format
    ``decide_format`` gives.

    A column mapping without ``fmt`` means the ``columns`` format.
    """
    source = as_source(source, max_bytes)
    fmt = decide_format(source, fmt, columns)
    if fmt == CONCURRENCY:
        raise TraceError(
            source.name,
            None,
            "a concurrency trace (timestamp,concurrency), not a request trace; "
            "it is replayed closed-loop with lengths from a request trace",
        )
    options = TraceOptions(dict(columns or {}), time_unit, model, block_tokens)
    return PARSERS[fmt](source, options)
