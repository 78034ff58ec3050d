"""A package's face: the names it offers (its ``__all__``), each imported from its module only
when first asked for, so that importing one module of a package does not import them all.

A package's ``__init__`` gives the names and their modules, and takes its ``__getattr__`` and
``__dir__`` from ``lazy``; type checkers read the same names from its ``TYPE_CHECKING`` imports.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy(
    package: str, names: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``, whose face maps each name to the
    module that defines it; any other name is an ``AttributeError``, as for a module."""

    def getattr_(name: str) -> Any:
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(module), name)

    def dir_() -> list[str]:
        return sorted(names)

    return getattr_, dir_
