"""The per-commit suite fits CI's time, by the durations a clean clone recorded.

``tests/data/ci-durations.json`` holds each test's seconds in the fast and the vllm tier as
``TUNER_DURATIONS_OUT=tests/data/ci-durations.json bash .ci/tiers`` recorded them on a clean clone
of a 2-core machine (docs/development.md says when). A test file that starts vLLM and has no
durations there fails here until they are recorded: a new slow test is measured before it lands.
"""

from __future__ import annotations

import json
import re

import pytest
from ci_durations import BUDGET_S, file_of, makespan_s
from conftest import REPO

RECORDED = REPO / "tests" / "data" / "ci-durations.json"
# A test or a module marked for the vllm tier: a decorator, or the module's ``pytestmark``.
MARKED = re.compile(r"^(@pytest\.mark\.vllm\b|pytestmark = (\[[^\]]*)?pytest\.mark\.vllm\b)", re.M)


def recorded() -> dict:
    return json.loads(RECORDED.read_text())


@pytest.mark.parametrize("tier", sorted(BUDGET_S))
def test_each_tier_as_recorded_fits_its_budget(tier: str) -> None:
    measured = recorded()["tiers"][tier]
    budget_s = BUDGET_S[tier]
    assert measured["wall_s"] <= budget_s, (tier, measured["wall_s"])
    # Its tests, on two processes, longest first: within the budget too, so that the wall time
    # was not a lucky order.
    assert makespan_s(measured["tests"].values()) <= budget_s


def test_every_file_that_starts_vllm_has_its_durations_recorded() -> None:
    slow = {
        f"tests/{path.name}"
        for path in (REPO / "tests").glob("test_*.py")
        if MARKED.search(path.read_text())
    }
    measured = {file_of(nodeid) for nodeid in recorded()["tiers"]["vllm"]["tests"]}
    assert slow - measured == set(), "record them: docs/development.md, 'Tests'"


def test_the_schedule_puts_each_test_on_the_first_process_free() -> None:
    assert makespan_s([]) == 0.0
    assert makespan_s([5.0, 1.0, 1.0, 1.0]) == 5.0
    assert makespan_s([3.0, 3.0, 2.0, 2.0, 2.0]) == 7.0
    assert makespan_s([4.0, 4.0], workers=1) == 8.0
