"""docs/flow.md names the functions a ``tuner run`` goes through: each name must exist."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

PAGE = Path(__file__).resolve().parent.parent / "docs" / "flow.md"
NAMED = re.compile(r"`([A-Za-z_][\w.]*)`")


def resolve(dotted: str) -> object:
    """The object a full dotted name (``tuner.cli.run.cmd_run``, ``tuner.x.Class.method``)
    names: the longest module prefix imported, the rest read as attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[cut:]:
            found = getattr(found, attribute)
        return found
    raise ModuleNotFoundError(dotted)


def test_every_function_the_flow_page_names_exists() -> None:
    names = NAMED.findall(PAGE.read_text())
    full = [n for n in names if n.startswith("tuner.")]
    assert len(full) >= 30
    classes = {n.rsplit(".", 1)[1]: resolve(n) for n in full if n.rsplit(".", 1)[1][:1].isupper()}
    for name in full:
        resolve(name)
    # ``Run.calibrate``: a method of a class the page named in full.
    short = [n for n in names if "." in n and n.split(".")[0] in classes]
    assert short
    for name in short:
        head, *rest = name.split(".")
        found = classes[head]
        for attribute in rest:
            found = getattr(found, attribute)
