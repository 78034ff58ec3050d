"""What a study optimises is asked of its objective (``tuner.study.setup.objective``), never
tested: no module but those that define an objective compares anything with a mode or an
objective's metric, tests which objective it has, or branches on the direction; and the report
asks its presenter (``tuner.report.presenters``) what to show, never the objective's flags.

Read from the code itself, as ``test_layout.py`` reads the imports: a module defines an
objective where it holds a subclass of ``StudyObjective`` (or of one of those), found by reading
the classes, not listed here.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "tuner"
BASE = "StudyObjective"

# The modes as words, and the names the modes, the objectives and their metrics go by.
MODE_WORDS = {"latency", "capacity", "goodput"}
MODE_NAMES = {
    "LATENCY",
    "CAPACITY",
    "SCORE",
    "LATENCY_OBJECTIVE",
    "CAPACITY_OBJECTIVE",
    "LATENCY_GOAL",
    "CAPACITY_GOAL",
    "GOODPUT",
    "GOODPUT_OBJECTIVE",
    "Latency",
    "Capacity",
    "Goodput",
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


TREES = {
    path.relative_to(PACKAGE).as_posix(): ast.parse(path.read_text())
    for path in PACKAGE.rglob("*.py")
}


def objective_modules(trees: Mapping[str, ast.AST]) -> set[str]:
    """The modules that define ``StudyObjective`` or a class derived from it, at any depth."""
    classes = {
        (module, node.name, tuple(filter(None, map(name_of, node.bases))))
        for module, tree in trees.items()
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
    }
    objectives = {BASE}
    while True:
        found = {name for _, name, bases in classes if objectives & set(bases)} - objectives
        if not found:
            break
        objectives |= found
    return {module for module, name, _ in classes if name in objectives}


DEFINING = objective_modules(TREES)
MODULES = sorted(set(TREES) - DEFINING)


def test_the_modules_that_define_objectives_are_found_by_their_classes() -> None:
    assert "study/setup/objective.py" in DEFINING
    trees = {
        "a.py": ast.parse("class Base(StudyObjective): pass"),
        "b.py": ast.parse("class Third(Base): pass\nclass Words: pass"),
        "c.py": ast.parse("class Words(ValueWords): pass"),
    }
    assert objective_modules(trees) == {"a.py", "b.py"}


@pytest.mark.parametrize("module", sorted(m for m in TREES if m.startswith("report/")))
def test_the_report_asks_its_presenter_not_the_objectives_flags(module: str) -> None:
    read = [
        node.lineno
        for node in ast.walk(TREES[module])
        if isinstance(node, ast.Attribute) and node.attr == "searches_rates"
    ]
    assert not read, f"tuner/{module}: lines {read} read searches_rates: ask presenter_of"


# The scripts of benchmarks/ that draw or tabulate a study through tuner.report, as the page does.
BENCHMARKS = PACKAGE.parent / "benchmarks"
REPORTING = sorted(
    path.relative_to(BENCHMARKS).as_posix()
    for path in BENCHMARKS.rglob("*.py")
    if "tuner.report" in path.read_text()
)


def test_the_benchmarks_that_report_are_found() -> None:
    assert "gpu/report.py" in REPORTING


@pytest.mark.parametrize("script", REPORTING)
def test_a_benchmark_that_reports_asks_the_presenter_too(script: str) -> None:
    read = [
        node.lineno
        for node in ast.walk(ast.parse((BENCHMARKS / script).read_text()))
        if isinstance(node, ast.Attribute) and node.attr == "searches_rates"
    ]
    assert not read, f"benchmarks/{script}: lines {read} read searches_rates: ask presenter_of"


@pytest.mark.parametrize("module", MODULES)
def test_no_module_tests_which_objective_it_is(module: str) -> None:
    found = mode_checks(TREES[module])
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
