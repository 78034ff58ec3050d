"""A trial's record (``tuner.study.store.record``): every attribute tuner keeps on a trial is
written there and read back there, as typed fields, on a real Optuna storage; the studies
shipped in ``benchmarks/results/`` read as records; and no other module of tuner names a trial's
attribute or reads or writes one itself (read from the code, as ``test_layout.py`` reads the
imports).
"""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from tuner.study.measure.scoring import Score
from tuner.study.measure.trial import ENGINE_START_S, TRIAL_S, WINDOW_S, TrialOutcome
from tuner.study.store import record
from tuner.study.store.record import Queued, TrialRecord

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "tuner"
RECORD = "study/store/record.py"
SHIPPED = sorted((REPO / "benchmarks" / "results").rglob("*.db"))
PHASES = (ENGINE_START_S, WINDOW_S, TRIAL_S)
# Words spelt like an attribute of a trial that name something else, where they are read.
OTHER_MEANINGS = {
    ("study/plan/spec.py", "engine_args"): "the spec's keys",
    ("study/plan/spec.py", "baseline"): "the spec's keys",
    ("study/plan/current.py", "baseline"): "the spec's keys",
    ("study/plan/space.py", "engine_args"): "the spec's keys",
    ("study/trials/fingerprint.py", "engine_args"): "the study's fingerprint",
    ("study/setup/calibrate.py", "capacity_req_per_s"): "the study's calibration",
    ("study/capacity/rates.py", "reason"): "a rate point's",
    ("study/capacity/text.py", "reason"): "a rate point's",
    ("report/rate_curves.py", "reason"): "a rate point's",
    ("engine/startup.py", "compile_key"): "the engine log's facts, stored as they are named",
    ("engine/startup.py", "compile_cache_hit"): "the engine log's facts",
    ("cli/result_json.py", "engine_args"): "the JSON document's fields (docs/results.md)",
    ("cli/result_json.py", "baseline"): "the JSON document's fields",
    ("cli/result_json.py", "candidate"): "the JSON document's fields",
    ("cli/result_json.py", "feasible"): "the JSON document's fields",
}


def _outcome() -> TrialOutcome:
    return TrialOutcome(
        engine_args={"max-num-seqs": 8},
        score=Score(0.4, {"slo_ttft_p95_s": -0.5}),
        metrics={"ttft_p95_s": 0.25, record.CAPACITY_ATTR: 3.5, record.RATES_ATTR: 4.0},
        timings={ENGINE_START_S: 30.0, WINDOW_S: 60.0, TRIAL_S: 95.0},
        reason="stopped at its gate",
        log_tail="x" * (record.LOG_TAIL_CHARS + 10),
        compile_cache={record.COMPILE_KEY_ATTR: "abc123", record.CACHE_HIT_ATTR: True},
        points=({"rate_req_per_s": 3.5, "passed": True},),
        compared={"rate_req_per_s": 5.0, "passed": False},
    )


def test_what_a_trial_measured_reads_back_as_typed_fields() -> None:
    study = optuna.create_study(storage=optuna.storages.InMemoryStorage())
    study.enqueue_trial({}, user_attrs=Queued(candidate=2).attrs())
    trial = study.ask()
    machine = {record.VLLM_VERSION: "0.32.0", record.DEVICE: "cpu"}
    record.started(trial, "host 123 456", {"max-num-seqs": 8}, machine)
    record.measured(trial, _outcome())
    study.tell(trial, 0.4)

    got = TrialRecord.of(study.trials[0])
    assert (got.number, got.state, got.value) == (0, TrialState.COMPLETE, 0.4)
    assert (got.candidate, got.baseline, got.confirms, got.move) == (2, False, None, None)
    assert got.worker == "host 123 456" and got.measured_on == machine
    assert got.engine_args == {"max-num-seqs": 8} and got.feasible
    assert got.constraints == {"slo_ttft_p95_s": -0.5}
    assert got.reason == "stopped at its gate" and len(got.log_tail) == record.LOG_TAIL_CHARS
    assert got.timings_s == {ENGINE_START_S: 30.0, WINDOW_S: 60.0, TRIAL_S: 95.0}
    assert (got.compile_key, got.compile_cache_hit) == ("abc123", True)
    assert got.points == ({"rate_req_per_s": 3.5, "passed": True},)
    assert got.compared == {"rate_req_per_s": 5.0, "passed": False}
    # The figures are the outcome's metrics, nothing of the record's own.
    assert dict(got.figures) == dict(_outcome().metrics)
    assert got.capacity_req_per_s == 3.5 and got.rates_measured == 4 and got.measured_capacity
    assert got.below_req_per_s is None and not got.client_behind


def test_a_queued_trial_says_what_it_is_while_measured() -> None:
    study = optuna.create_study(storage=optuna.storages.InMemoryStorage())
    for queued in (Queued(baseline=True), Queued(confirms=0), Queued(move="up max-num-seqs")):
        study.enqueue_trial({}, user_attrs=queued.attrs())
        assert Queued.of(study.ask()) == queued
    assert Queued(baseline=True).reference and Queued(candidate=0).reference
    assert not Queued(confirms=3).reference and not Queued().attrs()


def test_a_trial_without_tuner_s_attributes_reads_as_empty_fields() -> None:
    study = optuna.create_study(storage=optuna.storages.InMemoryStorage())
    study.tell(study.ask(), state=TrialState.FAIL)
    got = TrialRecord.of(study.trials[0])
    assert got.value is None and got.engine_args == {} and got.reason is None
    assert not (got.feasible or got.baseline or got.figures or got.timings_s or got.points)


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(REPO)))
def test_the_shipped_studies_read_as_records(path: Path, tmp_path: Path) -> None:
    copy = tmp_path / path.name
    shutil.copy(path, copy)
    storage = optuna.storages.RDBStorage(f"sqlite:///{copy}", skip_compatibility_check=True)
    read = 0
    for summary in optuna.get_all_study_summaries(storage):
        study = optuna.load_study(study_name=summary.study_name, storage=storage)
        for trial in study.get_trials(deepcopy=False):
            got = TrialRecord.of(trial)
            # Every attribute that is not a measured figure is one of the record's fields.
            words = {k: v for k, v in got.figures.items() if not isinstance(v, int | float)}
            assert not words, f"trial {trial.number} of {summary.study_name}: {words}"
            read += got.state == TrialState.COMPLETE
    assert read


def _is_study(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id == "study"


def _reads_or_writes(node: ast.AST) -> bool:
    """``x.user_attrs`` or ``x.set_user_attr`` of anything but a study."""
    if not isinstance(node, ast.Attribute):
        return False
    return node.attr in ("user_attrs", "set_user_attr") and not _is_study(node.value)


def _queued_by_hand(node: ast.keyword) -> bool:
    """``enqueue_trial(..., user_attrs={...})``: attributes named where the trial is queued."""
    return node.arg == "user_attrs" and isinstance(node.value, ast.Dict)


def _keys(tree: ast.AST) -> list[ast.expr]:
    """What ``tree`` uses as a key of a mapping: ``m[k]``, ``m.get(k)``, ``k in m``, ``{k: v}``
    (a word elsewhere, a label or a message, is no attribute's name)."""
    keys: list[ast.expr] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript):
            keys.append(node.slice)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in ("get", "pop", "setdefault") and node.args:
                keys.append(node.args[0])
        elif isinstance(node, ast.Compare) and isinstance(node.ops[0], ast.In | ast.NotIn):
            keys.append(node.left)
        elif isinstance(node, ast.Dict):
            keys.extend(k for k in node.keys if k is not None)
    return keys


def attribute_uses(tree: ast.AST, module: str) -> list[tuple[int, str]]:
    """Each place ``module`` names a trial's attribute, reads or writes one itself, by line.

    A study's own attributes (``study.user_attrs``: its fingerprint, its calibration) are not a
    trial's."""
    names = record.NAMES | {record.TIME_PREFIX + phase for phase in PHASES}
    found = set()
    for node in ast.walk(tree):
        if _reads_or_writes(node):
            found.add((getattr(node, "lineno", 0), f"a trial's attributes: {ast.unparse(node)}"))
        elif isinstance(node, ast.keyword) and _queued_by_hand(node):
            found.add((node.value.lineno, f"queued by hand: {ast.unparse(node)}"))
    for key in _keys(tree):
        named = isinstance(key, ast.Constant) and key.value in names
        if named and (module, ast.literal_eval(key)) not in OTHER_MEANINGS:
            found.add((key.lineno, f"an attribute's name: {ast.unparse(key)}"))
    return sorted(found)


MODULES = sorted(
    path.relative_to(PACKAGE).as_posix()
    for path in PACKAGE.rglob("*.py")
    if path.relative_to(PACKAGE).as_posix() != RECORD
)


@pytest.mark.parametrize("module", MODULES)
def test_no_module_names_a_trial_attribute_but_the_record(module: str) -> None:
    found = attribute_uses(ast.parse((PACKAGE / module).read_text()), module)
    said = "; ".join(f"line {line}: {what}" for line, what in found)
    assert not found, f"tuner/{module}: go through tuner.study.store.record: {said}"


def test_the_check_finds_each_kind_of_attribute_use() -> None:
    code = """
a = trial.user_attrs.get("x")
frozen.set_user_attr("x", 1)
study.enqueue_trial({}, user_attrs={"baseline": True})
seconds = row.timings.get("time_window_s")
b = attrs["capacity_points"]
"""
    found = attribute_uses(ast.parse(code), "m.py")
    assert sorted({line for line, _ in found}) == [2, 3, 4, 5, 6]
    # A study's own attributes, and a word of another meaning where it is read, are not.
    study_attrs = "w = study.user_attrs.get('workload')\nstudy.set_user_attr('w', 1)"
    assert not attribute_uses(ast.parse(study_attrs), "m.py")
    assert not attribute_uses(ast.parse("r = point.get('reason')"), "report/rate_curves.py")
    assert not attribute_uses(ast.parse("kind = 'baseline'\nsaid = f'{n} feasible'"), "m.py")
