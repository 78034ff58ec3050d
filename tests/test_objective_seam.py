"""What a study optimises is asked of its objective (``tuner.study.measure.objective``), never
tested: no module outside the objectives, and the places where the mode is read from the user,
compares anything with a mode or an objective's metric, or branches on the direction.

Read from the code itself, as ``test_layout.py`` reads the imports: a third objective is then a
subclass and an entry in ``OBJECTIVES``, with nothing to find elsewhere.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "tuner"

# Where an objective is defined and worded, and where the mode is read from the user (the spec,
# the default spec written for the command line's --objective, the option itself).
OBJECTIVE_MODULES = {
    "study/measure/objective.py",
    "study/measure/capacity_text.py",
    "study/plan/spec.py",
    "study/plan/space.py",
    "cli/parser.py",
}
# The modes as words, and the names the modes, the objectives and their metrics go by.
MODE_WORDS = {"latency", "capacity"}
MODE_NAMES = {
    "LATENCY",
    "CAPACITY",
    "SCORE",
    "LATENCY_OBJECTIVE",
    "CAPACITY_OBJECTIVE",
    "LATENCY_GOAL",
    "CAPACITY_GOAL",
    "Latency",
    "Capacity",
}
DIRECTION_NAMES = {"maximize", "maximise", "minimize", "minimise", "MAXIMIZE", "MINIMIZE"}


def name_of(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def is_mode(node: ast.AST) -> bool:
    """A mode word, or a name of a mode, an objective or an objective's metric."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value.lower() in MODE_WORDS
    return name_of(node) in MODE_NAMES


def mentions_direction(node: ast.AST) -> bool:
    return any(name_of(n) in DIRECTION_NAMES for n in ast.walk(node))


def mode_checks(tree: ast.AST) -> list[tuple[int, str]]:
    """Each comparison with a mode, ``isinstance`` of an objective, branch on the direction and
    read of it, by line."""
    found = set()
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Compare) and any(map(is_mode, [node.left, *node.comparators])):
            found.add((line, f"compares with a mode: {ast.unparse(node)}"))
        elif (
            isinstance(node, ast.Call)
            and name_of(node.func) == "isinstance"
            and any(is_mode(n) for n in ast.walk(node.args[1]))
        ):
            found.add((line, f"tests which objective: {ast.unparse(node)}"))
        elif isinstance(node, ast.If | ast.IfExp | ast.While) and mentions_direction(node.test):
            found.add((line, f"branches on the direction: {ast.unparse(node.test)}"))
        elif isinstance(node, ast.comprehension) and any(map(mentions_direction, node.ifs)):
            found.add((node.ifs[0].lineno, "filters on the direction"))
        elif isinstance(node, ast.Attribute) and node.attr in DIRECTION_NAMES - {"MAXIMIZE"}:
            # ``objective.maximize`` read anywhere: the direction worked out again.
            found.add((line, f"reads the direction: {ast.unparse(node)}"))
    return sorted(found)


MODULES = sorted(
    path.relative_to(PACKAGE).as_posix()
    for path in PACKAGE.rglob("*.py")
    if path.relative_to(PACKAGE).as_posix() not in OBJECTIVE_MODULES
)


@pytest.mark.parametrize("module", MODULES)
def test_no_module_tests_which_objective_it_is(module: str) -> None:
    found = mode_checks(ast.parse((PACKAGE / module).read_text()))
    said = "; ".join(f"line {line}: {what}" for line, what in found)
    assert not found, f"tuner/{module}: ask the objective instead: {said}"


def test_the_check_finds_each_kind_of_mode_check() -> None:
    code = """
if report.goal.metric == CAPACITY: pass
capacity = value == "capacity"
isinstance(objective, (Latency, Capacity))
what = "a" if group.maximize else "b"
ordered = [v for v in values if objective.maximise]
goal.maximise
"""
    assert sorted({line for line, _ in mode_checks(ast.parse(code))}) == [2, 3, 4, 5, 6, 7]
    # Asking the objective is no check.
    assert not mode_checks(ast.parse("rows = objective.rank(value)\nname = objective.metric"))
