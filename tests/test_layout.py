"""The package's layout: one folder per stage, imports flowing one way, no cycle, no long module
or function.

Read from the code itself (each module's imports, ``TYPE_CHECKING`` ones included), so the
picture of the stages in docs/development.md cannot drift from what the code does.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "tuner"

# The stages, top floor first. A module may import from its own stage and from stages on a
# lower floor; never from a stage on its own floor or above. ``testing`` (the stand-in server,
# for code outside tuner) is on top: no other stage imports it.
FLOORS = {
    "testing": 6,
    "cli": 5,
    "report": 4,
    "study": 3,
    "load": 2,
    "engine": 1,
    "traces": 1,
    "": 0,
}
# A guard against modules that gather several concepts, not a size to split at: most modules
# are 100 to 300 lines; past this, split along a concept,
# never by line count.
MAX_LINES = 500


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def stage(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in FLOORS) else ""


def tuner_imports(path: Path) -> set[str]:
    """The tuner modules ``path`` imports, whatever the form."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tuner"):
            for alias in node.names:
                candidate = f"{node.module}.{alias.name}"
                found.add(candidate if candidate in MODULES else node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("tuner"))
    return found


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
GRAPH = {name: tuner_imports(path) & MODULES.keys() for name, path in MODULES.items()}


def test_every_stage_is_a_folder():
    assert {stage(m) for m in MODULES} == set(FLOORS)
    top_level = sorted(m for m in MODULES if stage(m) == "")
    assert top_level == [
        "tuner",
        "tuner.build",
        "tuner.errors",
        "tuner.face",
        "tuner.flags",
        "tuner.urls",
    ]


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_run_down_the_stages(module):
    here = stage(module)
    wrong = [
        target
        for target in GRAPH[module]
        if stage(target) != here and FLOORS[stage(target)] >= FLOORS[here]
    ]
    assert not wrong, f"{module} ({here or 'root'}) imports {wrong}"


def test_no_module_of_tuner_imports_its_testing_stand_in():
    """``tuner.testing`` is for tests and benchmarks, tuner's and an embedding program's: no
    module of tuner outside it imports it, so tuner never runs its stand-in server itself."""
    importers = [
        module
        for module, targets in sorted(GRAPH.items())
        if stage(module) != "testing" and any(stage(t) == "testing" for t in targets)
    ]
    assert importers == []


# The study's sub-packages, likewise: its plan and what it keeps (side by side), one trial
# measured and judged, the capacity search over rates, what every trial of a study shares, the
# study's trials in Optuna, and what it answers. ``tuner.study`` itself holds no module.
STUDY_FLOORS = {
    "result": 6, "trials": 5, "setup": 4, "capacity": 3, "measure": 2, "store": 1, "plan": 1,
}  # fmt: skip


def study_part(module: str) -> str:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "study" else ""


def test_every_study_module_is_in_a_sub_package():
    study = sorted(m for m in MODULES if stage(m) == "study")
    assert {study_part(m) for m in study} == {"", *STUDY_FLOORS}
    assert [m for m in study if study_part(m) == ""] == ["tuner.study"]


@pytest.mark.parametrize("module", sorted(m for m in MODULES if study_part(m)))
def test_imports_run_down_the_study_sub_packages(module):
    here = study_part(module)
    wrong = [
        target
        for target in GRAPH[module]
        if study_part(target)
        and study_part(target) != here
        and STUDY_FLOORS[study_part(target)] >= STUDY_FLOORS[here]
    ]
    assert not wrong, f"{module} ({here}) imports {wrong}"


def test_no_import_cycle():
    done: set[str] = set()

    def visit(module: str, path: tuple[str, ...]) -> None:
        if module in path:
            cycle = (*path[path.index(module) :], module)
            pytest.fail("import cycle: " + " -> ".join(cycle))
        if module in done:
            return
        for target in GRAPH[module]:
            # A package's face (its __init__) importing its own modules is not a cycle.
            if target != module and module != target.rsplit(".", 1)[0]:
                visit(target, (*path, module))
        done.add(module)

    for module in MODULES:
        visit(module, ())


@pytest.mark.parametrize("module", sorted(MODULES))
def test_modules_stay_short(module):
    lines = len(MODULES[module].read_text().splitlines())
    assert lines <= MAX_LINES, f"{module} has {lines} lines; split it by what it does"


# A function longer than this does several things in a row: name them as functions of their own.
MAX_FUNCTION_LINES = 60


@pytest.mark.parametrize("module", sorted(MODULES))
def test_functions_stay_short(module):
    tree = ast.parse(MODULES[module].read_text())
    long = [
        f"{node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert not long, f"{module}: {', '.join(long)}; split by what each part does"


# What code outside the package may import: a stage's face (its ``__all__``) or a root module.
FACES = {m for m in MODULES if m.count(".") == 1}
BENCHMARKS = PACKAGE.parent / "benchmarks"


@pytest.mark.parametrize("path", sorted(BENCHMARKS.rglob("*.py")), ids=str)
def test_benchmarks_import_only_the_faces(path):
    """A benchmark imports ``from tuner.study import Run``, never a module inside a stage, and
    only names the face offers."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tuner."):
            assert node.module in FACES, f"{path.name}:{node.lineno} imports {node.module}"
            offered = __import__(node.module, fromlist=["__all__"])
            if node.module.split(".")[1] in FLOORS:
                missing = {a.name for a in node.names} - set(offered.__all__)
                assert not missing, f"{path.name}:{node.lineno}: {missing} not in {node.module}"


@pytest.mark.parametrize("face", sorted(m for m in FACES if m.split(".")[1] in FLOORS))
def test_each_name_a_face_offers_is_there(face):
    module = __import__(face, fromlist=["__all__"])
    for name in module.__all__:
        assert getattr(module, name) is not None
    assert set(module.__all__) <= set(dir(module))
    with pytest.raises(AttributeError):
        _ = module.not_a_name_it_offers
