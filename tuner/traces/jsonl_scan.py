"""JSONL of one flat shape, read as bytes: the fast reader behind ``read_jsonl``
(``tuner.traces.jsonl_reader``).

The usual trace line, {"timestamp": 6, "input_length": 1016, "hash_ids": [0, 1]}, is read
without building a dict per line: bytes.translate parts each chunk into the keys' characters
and the rest, and numpy reads the rest. Anything else goes to the exact readers.
"""

from __future__ import annotations

import json
import math
import re
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from tuner.traces.model import IntLists
    from tuner.traces.table import Kind

SCAN_CHARS = 1 << 20
"""Text is read about 1 MiB at a time (in whole lines): small arrays stay in the CPU caches."""
_KEY_CHARS = (string.ascii_letters + "_").encode()
_NOT_KEY_CHARS = bytes(sorted(set(range(256)) - set(_KEY_CHARS + b'"')))
_NUMBER_CHARS = b"0123456789.-"
# Classes of the bytes left once the keys' letters are gone; 0: a byte not allowed there.
_NUMBER, _OBJECT, _END, _LIST, _LIST_END, _COMMA, _COLON, _QUOTE, _NEWLINE, _SPACE = range(1, 11)
_CLASSES = bytearray(256)
for _char, _class in zip(
    _NUMBER_CHARS + b'{}[],:"\n ', [_NUMBER] * 12 + list(range(_OBJECT, _SPACE + 1)), strict=True
):
    _CLASSES[_char] = _class
_FOLLOWERS = {
    _NUMBER: (_NUMBER, _COMMA, _LIST_END, _END),
    _OBJECT: (_QUOTE,),
    _END: (_NEWLINE,),
    _LIST: (_NUMBER, _LIST_END),
    _LIST_END: (_COMMA, _END),
    _COMMA: (_QUOTE, _NUMBER, _SPACE),
    _COLON: (_NUMBER, _LIST, _SPACE),
    _QUOTE: (_QUOTE, _COLON),
    _NEWLINE: (_OBJECT, _NEWLINE),
    _SPACE: (_QUOTE, _NUMBER, _LIST),
}
"""Which class may follow which. With a line's punctuation fixed (``Shape``), this puts
exactly one number in each number's place, and one in each gap of a list."""
_GOOD_PAIRS = bytes(a * 16 + b for a, followers in _FOLLOWERS.items() for b in followers)
_MAX_DIGITS = 16
"""Integers of up to 16 digits are read here; longer ones go to the exact readers."""
_JSON_NUMBER = re.compile(rb"-?(?:0|[1-9][0-9]*)(\.[0-9]+)?")
_PLAIN_KEY = re.compile(r"[A-Za-z_]+")


@dataclass(frozen=True)
class Shape:
    """The first record's keys, in order, which of them hold lists, and what is left of a line
    of this shape once its keys' letters, numbers and spaces are taken out."""

    keys: tuple[str, ...]
    lists: frozenset[str]
    quoted: bytes  # the keys as the line writes them: "timestamp""input_length"...
    punctuation: re.Pattern[bytes]  # {"":,"":,"":[,*]} or an empty line

    @classmethod
    def of(cls, text: str) -> Shape | None:
        """The shape of the first record, if it is a flat object with plain keys (letters and
        ``_``) holding numbers and lists."""
        begin, line = 0, ""
        while begin < len(text) and not line.strip():
            end = text.find("\n", begin)
            end = len(text) if end < 0 else end
            line, begin = text[begin:end], end + 1
        try:
            record = json.loads(line)
        except (ValueError, RecursionError):
            return None
        if type(record) is not dict or not record:
            return None
        pairs = []
        for key, value in record.items():
            if not _PLAIN_KEY.fullmatch(key) or type(value) not in (int, float, list):
                return None
            pairs.append('"":' + (r"\[,*\]" if type(value) is list else ""))
        return cls(
            keys=tuple(record),
            lists=frozenset(key for key, value in record.items() if type(value) is list),
            quoted="".join(f'"{key}"' for key in record).encode(),
            punctuation=re.compile(rb"(?:\{" + ",".join(pairs).encode() + rb"\})?"),
        )


@dataclass(frozen=True)
class Chunk:
    """The numbers of some lines of one shape, in order, and where each key's numbers are.

    ``number`` is each as JSON reads it, as float; ``integer`` marks the integers, whose exact
    values are in ``whole``.
    """

    rows: int
    row_lines: np.ndarray  # per row: its line, counted from 0 in the chunk
    newlines: int
    first: np.ndarray  # (rows, keys): the index of the first number after each key
    number: np.ndarray
    integer: np.ndarray
    whole: np.ndarray

    def after(self, key: int) -> tuple[np.ndarray, np.ndarray]:
        """Per row, the numbers of key number ``key``: ``(first, stop)`` indices."""
        first = self.first[:, key]
        if key + 1 < self.first.shape[1]:
            return first, self.first[:, key + 1]
        return first, np.append(self.first[1:, 0], len(self.number))


def read_chunk(data: bytes, shape: Shape) -> Chunk | None:
    """The numbers of whole lines ``data``, or None unless every line is of ``shape``."""
    rest = b"\n" + data.translate(None, _KEY_CHARS) + b"\n"
    classes = np.frombuffer(rest.translate(_CLASSES), dtype=np.uint8)
    if (classes[:-1] * 16 + classes[1:]).tobytes().translate(None, _GOOD_PAIRS):
        return None
    lines = set(rest.translate(None, _NUMBER_CHARS + b" ").split(b"\n"))
    if not all(shape.punctuation.fullmatch(line) for line in lines):
        return None
    numbers = classes == _NUMBER
    edges = np.flatnonzero(numbers[1:] != numbers[:-1]) + 1  # a number's start, then its end
    starts, ends = edges[0::2], edges[1::2]
    colons = np.flatnonzero(classes == _COLON)  # one per key
    width = len(shape.keys)
    rows = len(colons) // width
    if data.translate(None, _NOT_KEY_CHARS) != shape.quoted * rows:
        return None
    values = _parse_numbers(rest, starts, ends)
    if values is None:
        return None
    first = np.searchsorted(starts, colons).reshape(rows, width)  # numbers before each colon
    if rest.find(b"\n\n", 0, len(rest) - 1) >= 0:  # blank lines: rows are not lines
        newlines = np.flatnonzero(classes == _NEWLINE)
        row_lines = np.searchsorted(newlines, colons[::width]) - 1
    else:
        row_lines = np.arange(rows)
    return Chunk(rows, row_lines, rest.count(b"\n") - 2, first, *values)


_HIGH_BYTES = np.array([0] + [(1 << 64) - (1 << 8 * (8 - n)) for n in range(1, 9)], np.uint64)
_ZERO_CHARS = int.from_bytes(b"0" * 8, "little")


def _eight_digits(words: np.ndarray, length: np.ndarray) -> np.ndarray:
    """The integers of 1 to 8 digits that end the 8-byte little-endian ``words``.

    The bytes before the number become leading zeros; then adjacent digits, pairs and quads
    combine by multiplication (the usual SWAR reading of eight ASCII digits).
    """
    digits = (words ^ _ZERO_CHARS) & _HIGH_BYTES[length]
    pairs = (digits * (10 * 256 + 1)) >> 8
    quads = ((pairs & 0x00FF00FF00FF00FF) * (100 * 2**16 + 1)) >> 16
    return ((quads & 0x0000FFFF0000FFFF) * (10000 * 2**32 + 1)) >> 32


def _parse_numbers(
    rest: bytes, starts: np.ndarray, ends: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """``(number, integer, whole)`` of the numbers ``rest[starts[i]:ends[i]]`` (see ``Chunk``),
    or None where one is not a JSON number or is an integer of more than 16 digits."""
    raw = np.frombuffer(rest, dtype=np.uint8)
    length = ends - starts
    integer = np.ones(len(starts), dtype=bool)
    if b"-" in rest or b"." in rest:
        signs = np.flatnonzero((raw == ord("-")) | (raw == ord(".")))
        integer[np.searchsorted(starts, signs, side="right") - 1] = False
    if np.any(integer & (length > 1) & (raw[starts] == ord("0"))):
        return None  # a leading zero
    longest = np.max(length, where=integer, initial=0)
    if longest > _MAX_DIGITS:
        return None
    padded = bytes(8) + rest
    words = np.ndarray((len(rest) + 1,), dtype="<u8", buffer=padded, strides=(1,))
    whole = _eight_digits(words[ends], np.minimum(length, 8))
    if longest > 8:
        long = np.flatnonzero(integer & (length > 8))
        whole[long] += _eight_digits(words[ends[long] - 8], length[long] - 8) * 10**8
    whole = whole.view(np.int64)
    number = whole.astype(np.float64)
    for i in np.flatnonzero(~integer).tolist():
        text = rest[starts[i] : ends[i]]
        match = _JSON_NUMBER.fullmatch(text)
        if match is None or (match[1] is None and len(text.lstrip(b"-")) > _MAX_DIGITS):
            return None
        if match[1] is None:
            whole[i] = int(text)
            number[i] = float(whole[i])
            integer[i] = True
        else:
            number[i] = float(text)
    return number, integer, whole


def scanned_columns(
    chunk: Chunk,
    shape: Shape,
    wanted: Mapping[str, Kind],
    lists: Sequence[str],
    optional: Sequence[str],
) -> tuple[dict[str, np.ndarray], dict[str, IntLists]] | None:
    """The chunk's ``wanted`` and ``lists`` keys, or None where the exact reader must decide
    (a missing key, a list where a number belongs, a number that is not a valid id)."""
    columns: dict[str, np.ndarray] = {}
    for name, kind in wanted.items():
        if name not in shape.keys:
            if name not in optional:
                return None
            columns[name] = np.full(chunk.rows, "" if kind == "text" else math.nan)
            continue
        if name in shape.lists:
            return None
        pick, _ = chunk.after(shape.keys.index(name))
        if kind != "text":
            columns[name] = chunk.number[pick]
        elif np.all(chunk.integer[pick]):
            columns[name] = chunk.whole[pick].astype(str)
        else:
            return None
    list_values: dict[str, IntLists] = {}
    for name in lists:
        if name not in shape.keys:
            if name not in optional:
                return None
            empty = np.zeros(chunk.rows + 1, dtype=np.int64)
            list_values[name] = (np.zeros(0, dtype=np.int64), empty)
            continue
        if name not in shape.lists:
            return None
        first, stop = chunk.after(shape.keys.index(name))
        counts = stop - first
        offsets = np.zeros(chunk.rows + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        pick = np.repeat(first - offsets[:-1], counts) + np.arange(offsets[-1])
        ids = chunk.whole[pick]
        if not np.all(chunk.integer[pick]) or np.any(ids < 0):
            return None
        list_values[name] = (ids, offsets)
    return columns, list_values


def concatenate(parts: Sequence[IntLists]) -> IntLists:
    """Flat lists of consecutive rows as one."""
    shifts = np.cumsum([0] + [offsets[-1] for _, offsets in parts[:-1]])
    offsets = [parts[0][1][:1]] + [o[1:] + s for (_, o), s in zip(parts, shifts, strict=True)]
    return np.concatenate([ids for ids, _ in parts]), np.concatenate(offsets)
