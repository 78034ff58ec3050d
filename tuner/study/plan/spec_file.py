"""A study spec's file, read as a YAML document of bounded size.

A spec is a page of settings. A file much larger than that, or a document whose aliases
(``*name``) expand it to many times its size, is refused before anything reads it as a spec,
as are tags that ``yaml.safe_load`` does not build (``!!python/object``). Numbers are read as
YAML 1.2 reads them: ``5e-2`` is a number, as ``5.0e-2`` is in YAML 1.1.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from tuner.errors import SpecError

# Bytes: the default spec is about 2 KiB, a spec with a hundred candidates about 20 KiB.
MAX_SPEC_BYTES = 1 << 20
# Values (scalars, lists and mappings) in the document with every alias expanded.
MAX_SPEC_VALUES = 100_000


class SpecLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that also reads an exponent without a dot (``5e-2``) as a float."""


SpecLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def read_spec_document(path: Path, quote: bool = True) -> Any:
    """The YAML document in ``path``; a ``SpecError`` naming the file for anything else. Not
    ``quote``: a YAML error names its line and column without the line's text (a serving
    file's line may hold a credential)."""
    try:
        with path.open("rb") as handle:
            raw = handle.read(MAX_SPEC_BYTES + 1)
    except OSError as exc:
        raise SpecError(str(path), "<file>", exc.strerror or str(exc)) from None
    if len(raw) > MAX_SPEC_BYTES:
        raise SpecError(
            str(path), "<file>", f"larger than {MAX_SPEC_BYTES >> 20} MiB; is it a study spec?"
        )
    if raw.startswith((b"\xff\xfe", b"\xfe\xff")) or b"\x00" in raw[:2]:
        raise SpecError(
            str(path), "<file>", "UTF-16 text; specs are read as UTF-8: iconv -f UTF-16 -t UTF-8"
        )
    try:
        data = yaml.load(raw.decode(), Loader=SpecLoader)
    except UnicodeDecodeError as exc:
        raise SpecError(str(path), "<file>", f"not UTF-8 text ({exc.reason})") from None
    except yaml.YAMLError as exc:
        said = str(exc) if quote else _unquoted(exc)
        raise SpecError(str(path), "<yaml>", " ".join(said.split())) from None
    except RecursionError:
        raise SpecError(str(path), "<yaml>", "nested too deeply") from None
    if count_values(data, MAX_SPEC_VALUES) > MAX_SPEC_VALUES:
        raise SpecError(
            str(path),
            "<yaml>",
            f"expands to more than {MAX_SPEC_VALUES} values (aliases repeated?)",
        )
    return data


def _unquoted(exc: yaml.YAMLError) -> str:
    """A YAML error's problem and where it is, without the text of the line it quotes."""
    if not isinstance(exc, yaml.MarkedYAMLError):
        return type(exc).__name__
    mark = exc.problem_mark or exc.context_mark
    where = "" if mark is None else f" at line {mark.line + 1}, column {mark.column + 1}"
    return f"{exc.problem or exc.context or 'not YAML'}{where}"


def count_values(data: Any, limit: int) -> int:
    """The values in ``data``, an alias counted each time it appears; stops past ``limit``.

    A self-referring document (``&a [*a]``) counts past any limit.
    """
    count = 0
    stack = [data]
    while stack and count <= limit:
        value = stack.pop()
        count += 1
        if isinstance(value, Mapping):
            stack.extend(value.keys())
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
    return count
