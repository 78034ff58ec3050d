"""A trace's bytes, read once: from a file, a pipe, a FIFO or standard input (``-``).

Everything tuner learns of a trace (its format, its requests, its SHA-256) comes from the one
``TraceText`` that ``read_source`` returns, so a source that can be read only once (a pipe,
``/dev/stdin``, a FIFO) gives the same requests as the file it came from. The text is bounded
(``MAX_TRACE_BYTES``), UTF-8, and has ``\\n`` line ends; anything else is a ``TraceError``
naming the source.
"""

from __future__ import annotations

import hashlib
import os
import stat
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from tuner.errors import TraceError

MAX_TRACE_BYTES = 512 * 1024 * 1024
"""Traces larger than this are refused: reading one takes several GB of memory."""

STDIN = "-"
"""The name that reads the trace from standard input."""

_UTF16_MARKS = (b"\xff\xfe", b"\xfe\xff")


@dataclass(frozen=True)
class TraceText:
    """A trace as read: ``name`` (what messages call it), its ``text`` and the SHA-256 of its
    bytes (which trace a study and a written configuration came from)."""

    name: str
    text: str
    sha256: str


def is_stdin(path: str | Path) -> bool:
    """Whether ``path`` names standard input (``-``)."""
    return str(path) == STDIN


def read_source(path: str | Path, max_bytes: int = MAX_TRACE_BYTES) -> TraceText:
    """The trace at ``path`` (``-``: standard input), read in one pass; refuses a source over
    ``max_bytes``, binary data, UTF-16 and other text that is not UTF-8, and an empty one."""
    name = str(path)
    try:
        if is_stdin(path):
            raw = _read_bounded(sys.stdin.buffer, name, max_bytes)
        else:
            with Path(path).open("rb") as handle:
                raw = _read_bounded(handle, name, max_bytes)
    except OSError as exc:
        raise TraceError(name, None, f"cannot read: {exc.strerror or exc}") from None
    return TraceText(name, _text(name, raw), hashlib.sha256(raw).hexdigest())


def _read_bounded(handle: BinaryIO, name: str, max_bytes: int) -> bytes:
    """All of ``handle``, or a ``TraceError`` once it holds more than ``max_bytes`` (a regular
    file's size is looked at first, so a huge one is refused unread)."""
    info = os.fstat(handle.fileno())
    size = info.st_size if stat.S_ISREG(info.st_mode) else 0
    raw = b"" if size > max_bytes else handle.read(max_bytes + 1)
    if size > max_bytes or len(raw) > max_bytes:
        shown = f"{size / 2**20:.0f} MiB is" if size else "the input is"
        raise TraceError(
            name,
            None,
            f"{shown} over the {max_bytes / 2**20:.0f} MiB limit on trace files; cut the hours "
            "you want to tune for into a smaller file",
        )
    return raw


def _text(name: str, raw: bytes) -> str:
    """``raw`` as text with ``\\n`` line ends, or the ``TraceError`` that says why not."""
    if raw.startswith(_UTF16_MARKS) or (len(raw) > 1 and (raw[0] == 0) != (raw[1] == 0)):
        raise TraceError(
            name, 1, "UTF-16 text; traces are read as UTF-8: iconv -f UTF-16 -t UTF-8 converts it"
        )
    zero = raw.find(b"\x00")
    if zero >= 0:
        line = raw.count(b"\n", 0, zero) + 1
        raise TraceError(name, line, "binary data (a NUL byte), not a text trace")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise TraceError(name, line, "not UTF-8 text") from None
    text = text.removeprefix("\ufeff")
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    if not text or text.isspace():  # (not text.strip(), without copying the text)
        raise TraceError(name, None, "the file is empty")
    return text


def as_source(trace: TraceText | str | Path, max_bytes: int = MAX_TRACE_BYTES) -> TraceText:
    """``trace`` as read: itself if it is read already, else ``read_source`` of it."""
    return trace if isinstance(trace, TraceText) else read_source(trace, max_bytes)
