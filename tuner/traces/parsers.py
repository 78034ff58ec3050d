"""One parser per trace format, ``(source, options) -> Trace``, ``source`` a trace's text as
read once (``tuner.traces.source``).

A malformed file raises ``TraceError`` naming the file and line; nothing else escapes a parser.
Documented handling rather than errors: rows out of time order are sorted (with a warning);
equal timestamps are kept (bursts arrive together); BurstGPT rows with 0 response tokens are
failed requests and are dropped (with a warning saying how many).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from tuner.errors import TraceError
from tuner.traces.csv_reader import read_csv
from tuner.traces.jsonl_reader import read_jsonl
from tuner.traces.model import HashIds, IntLists, Trace, from_columns
from tuner.traces.source import TraceText
from tuner.traces.table import Kind, Table, first_record_line, timestamps

logger = logging.getLogger(__name__)

TIME_UNITS_PER_S = {"s": 1.0, "ms": 1e3, "us": 1e6, "ns": 1e9}
MAX_TOKENS = 10_000_000
"""Longest prompt or output accepted; anything longer is a corrupt row, not a request."""

ROLES = ("timestamp", "input_tokens", "output_tokens", "session_id", "hash_ids")

CANONICAL_COLUMNS = ("timestamp", "input_tokens", "output_tokens")
AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
BURSTGPT_COLUMNS = ("Timestamp", "Request tokens", "Response tokens", "Model")
MOONCAKE_KEYS = ("timestamp", "input_length", "output_length", "hash_ids")
BAILIAN_KEYS = ("timestamp", "input_length", "output_length", "hash_ids", "chat_id")
CONCURRENCY_COLUMNS = ("timestamp", "concurrency")
MOONCAKE_BLOCK_TOKENS = 512
BAILIAN_BLOCK_TOKENS = 16


@dataclass(frozen=True)
class TraceOptions:
    """What the command line may add to a format: a column mapping, a time unit, a model.

    ``columns`` maps a role (``timestamp``, ``input_tokens``, ``output_tokens``, and optionally
    ``session_id``, ``hash_ids``) to the file's column or key; ``time_unit`` applies to numeric
    timestamps of the ``columns`` format; ``model`` keeps only that model's BurstGPT rows.
    """

    columns: Mapping[str, str] = field(default_factory=dict)
    time_unit: str = "s"
    model: str | None = None
    block_tokens: int = 0


Parser = Callable[[TraceText, TraceOptions], Trace]
DEFAULT_OPTIONS = TraceOptions()


def _lengths(table: Table, column: str, label: str) -> np.ndarray:
    values = table.columns[column]
    bad = ~np.isfinite(values) | (values <= 0) | (values != np.floor(values))
    bad |= values > MAX_TOKENS
    if np.any(bad):
        row = int(np.argmax(bad))
        value = values[row]
        if not np.isfinite(value) or value != np.floor(value):
            table.fail(row, f"{label} is not a whole number: {value!r}")
        if value <= 0:
            table.fail(row, f"{label} must be positive, got {value:.0f}")
        table.fail(row, f"{label} is implausibly long ({value:.0f} > {MAX_TOKENS} tokens)")
    return values.astype(np.int64)


def _arrivals(table: Table, column: str, units_per_s: float = 1.0) -> np.ndarray:
    return timestamps(table, column, units_per_s)


def _build(
    path: str,
    arrival_s: np.ndarray,
    inputs: np.ndarray,
    outputs: np.ndarray,
    *,
    hash_ids: HashIds | None = None,
    block_tokens: int = 0,
    session_id: np.ndarray | None = None,
) -> Trace:
    steps = np.diff(arrival_s)
    backwards = int(np.count_nonzero(steps < 0))
    if backwards:
        logger.warning("%s: %d timestamps go backwards; requests sorted by time", path, backwards)
    ties = int(np.count_nonzero(steps == 0))
    if ties:
        logger.info("%s: %d requests share a timestamp with the one before; kept", path, ties)
    return from_columns(
        arrival_s,
        inputs,
        outputs,
        source=path,
        hash_ids=hash_ids,
        block_tokens=block_tokens,
        session_id=session_id,
    )


def _is_jsonl(path: str, text: str) -> bool:
    return first_record_line(path, text)[1].lstrip().startswith("{")


def _has_column(path: str, text: str, name: str) -> bool:
    """Whether the header (CSV) or the first record (JSONL) names ``name``."""
    line = first_record_line(path, text)[1]
    if not line.lstrip().startswith("{"):
        return name in {column.strip() for column in line.split(",")}
    try:
        first = json.loads(line)
    except (ValueError, RecursionError):
        return False  # read_jsonl reports the line
    return isinstance(first, dict) and name in first


def read_canonical(source: TraceText, options: TraceOptions = DEFAULT_OPTIONS) -> Trace:
    """``timestamp,input_tokens,output_tokens[,session_id]`` as CSV or JSONL.

    Timestamps are seconds, or ISO 8601 datetimes (naive ones are UTC).
    """
    path, text = source.name, source.text
    session = "session_id" if _has_column(path, text, "session_id") else None
    wanted: dict[str, Kind] = {"timestamp": "time", "input_tokens": "number"}
    wanted["output_tokens"] = "number"
    if session:
        wanted[session] = "text"
    if _is_jsonl(path, text):
        table, _ = read_jsonl(path, text, wanted, optional=(session,) if session else ())
    else:
        table = read_csv(path, text, wanted)
    return _build(
        path,
        _arrivals(table, "timestamp"),
        _lengths(table, "input_tokens", "input_tokens"),
        _lengths(table, "output_tokens", "output_tokens"),
        session_id=table.columns[session] if session else None,
    )


def read_azure_csv(source: TraceText, options: TraceOptions = DEFAULT_OPTIONS) -> Trace:
    """Azure LLM inference trace: ``TIMESTAMP,ContextTokens,GeneratedTokens``."""
    path, text = source.name, source.text
    wanted: dict[str, Kind] = {"TIMESTAMP": "time", "ContextTokens": "number"}
    wanted["GeneratedTokens"] = "number"
    table = read_csv(path, text, wanted)
    return _build(
        path,
        _arrivals(table, "TIMESTAMP"),
        _lengths(table, "ContextTokens", "ContextTokens"),
        _lengths(table, "GeneratedTokens", "GeneratedTokens"),
    )


def read_burstgpt(source: TraceText, options: TraceOptions = DEFAULT_OPTIONS) -> Trace:
    """BurstGPT: ``Timestamp`` (s), ``Request tokens``, ``Response tokens``, ``Model``.

    Columns are read by name (some releases insert ``Session ID,Elapsed time``). Rows with 0
    response tokens are failed requests: dropped, with a warning saying how many.
    """
    path, text = source.name, source.text
    wanted: dict[str, Kind] = {"Timestamp": "time", "Request tokens": "number"}
    wanted |= {"Response tokens": "number", "Model": "text"}
    table = read_csv(path, text, wanted)
    keep = np.ones(len(table), dtype=bool)
    if options.model is not None:
        keep = table.columns["Model"] == options.model
        if not keep.any():
            models = ", ".join(sorted(set(table.columns["Model"].tolist()))[:10])
            raise TraceError(path, None, f"no rows of model {options.model!r}; found {models}")
    failed = keep & (table.columns["Response tokens"] == 0)
    if failed.any():
        logger.warning(
            "%s: dropped %d failed requests (0 response tokens) of %d",
            path,
            int(failed.sum()),
            int(keep.sum()),
        )
        keep &= ~failed
    if not keep.any():
        raise TraceError(path, None, "no successful requests (all have 0 response tokens)")
    rows = np.flatnonzero(keep)
    kept = Table(
        table.path,
        {name: values[rows] for name, values in table.columns.items()},
        lambda row: table.line_of(int(rows[row])),
    )
    return _build(
        path,
        _arrivals(kept, "Timestamp"),
        _lengths(kept, "Request tokens", "Request tokens"),
        _lengths(kept, "Response tokens", "Response tokens"),
    )


def _read_blocks(
    source: TraceText, options: TraceOptions, units_per_s: float, block_tokens: int, chat: bool
) -> Trace:
    path, text = source.name, source.text
    wanted: dict[str, Kind] = {"timestamp": "time", "input_length": "number"}
    wanted["output_length"] = "number"
    optional: tuple[str, ...] = ("hash_ids",)
    if chat:
        wanted |= {"chat_id": "text", "parent_chat_id": "text"}
        optional += ("chat_id", "parent_chat_id")
    table, lists = read_jsonl(path, text, wanted, lists=("hash_ids",), optional=optional)
    hash_ids = HashIds(*lists["hash_ids"])
    shared = hash_ids.block_count > 0
    session = _conversations(table) if chat else None
    return _build(
        path,
        _arrivals(table, "timestamp", units_per_s),
        _lengths(table, "input_length", "input_length"),
        _lengths(table, "output_length", "output_length"),
        hash_ids=hash_ids if shared else None,
        block_tokens=block_tokens if shared else 0,
        session_id=session,
    )


def _conversations(table: Table) -> np.ndarray:
    """The first ``chat_id`` of each request's conversation, following ``parent_chat_id``."""
    chats = table.columns["chat_id"].tolist()
    parents = dict(zip(chats, table.columns["parent_chat_id"].tolist(), strict=True))
    roots: dict[str, str] = {}
    out = []
    for chat in chats:
        seen = [chat]
        node = chat
        while node in parents and parents[node] in parents and len(seen) < 10_000:
            node = parents[node]
            if node in roots:
                break
            seen.append(node)
        root = roots.get(node, node)
        for item in seen:
            roots[item] = root
        out.append(root)
    return np.asarray(out, dtype=str)


def read_mooncake(source: TraceText, options: TraceOptions = DEFAULT_OPTIONS) -> Trace:
    """Mooncake JSONL: ``timestamp`` in ms, ``input_length``, ``output_length``, ``hash_ids``.

    Each hash id is one 512-token block; equal leading ids become equal prompt prefixes.
    """
    return _read_blocks(source, options, 1e3, MOONCAKE_BLOCK_TOKENS, chat=False)


def read_bailian(source: TraceText, options: TraceOptions = DEFAULT_OPTIONS) -> Trace:
    """Alibaba Bailian JSONL: ``timestamp`` in s, lengths, 16-token ``hash_ids``, ``chat_id``."""
    return _read_blocks(source, options, 1.0, BAILIAN_BLOCK_TOKENS, chat=True)


def read_mapped(source: TraceText, options: TraceOptions = DEFAULT_OPTIONS) -> Trace:
    """Any CSV or JSONL, with ``options.columns`` naming the columns and ``time_unit``."""
    columns = options.columns
    path, text = source.name, source.text
    missing = [role for role in CANONICAL_COLUMNS if role not in columns]
    if missing:
        raise TraceError(path, None, f"the column mapping lacks {', '.join(missing)}")
    if options.time_unit not in TIME_UNITS_PER_S:
        raise TraceError(path, None, f"unknown time unit {options.time_unit!r}")
    names = (columns["timestamp"], columns["input_tokens"], columns["output_tokens"])
    session = columns.get("session_id")
    hash_key = columns.get("hash_ids")
    wanted: dict[str, Kind] = {names[0]: "time", names[1]: "number", names[2]: "number"}
    if session:
        wanted[session] = "text"
    lists: dict[str, IntLists] = {}
    if _is_jsonl(path, text):
        table, lists = read_jsonl(path, text, wanted, lists=(hash_key,) if hash_key else ())
    else:
        if hash_key:
            raise TraceError(path, None, "hash_ids can only be mapped in JSONL traces")
        table = read_csv(path, text, wanted)
    hash_ids = HashIds(*lists[hash_key]) if hash_key else None
    if hash_key and options.block_tokens <= 0:
        raise TraceError(path, None, "mapping hash_ids needs the block size in tokens")
    return _build(
        path,
        _arrivals(table, names[0], TIME_UNITS_PER_S[options.time_unit]),
        _lengths(table, names[1], names[1]),
        _lengths(table, names[2], names[2]),
        hash_ids=hash_ids,
        block_tokens=options.block_tokens if hash_key else 0,
        session_id=table.columns[session] if session else None,
    )
