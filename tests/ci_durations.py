"""The suite's recorded durations, and whether its tiers fit their budgets.

``TUNER_DURATIONS_OUT=FILE bash .ci/tiers`` (on a clean clone, nothing else running) records
each test's seconds (setup, call and teardown added up) into FILE, a JSON object of the tier
it ran in, the wall seconds each tier took and the date and commit measured;
``tests/data/ci-durations.json`` is the one committed, which ``tests/test_ci_budget.py`` holds
to the budgets below. The hooks run in pytest's main process, which sees every worker's
reports.
"""

from __future__ import annotations

import heapq
import json
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

OUT = "TUNER_DURATIONS_OUT"
# The seconds each per-commit tier may take on a clean clone of a 2-core machine (CI's). The
# whole command must stay under 1,800: `.ci/setup --tests` (about 3 minutes where pip's cache
# and the Debian packages are there, as on CI's machine), lint (about a minute), the fast tier
# and the vllm tier, with a minute to spare.
BUDGET_S = {"fast": 180.0, "vllm": 1320.0}
WORKERS = 2

_seconds: dict[str, float] = {}
_started: list[float] = []


def pytest_sessionstart(session: pytest.Session) -> None:
    _started.append(time.monotonic())


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if os.environ.get(OUT):
        _seconds[report.nodeid] = _seconds.get(report.nodeid, 0.0) + report.duration


def pytest_sessionfinish(session: pytest.Session) -> None:
    path = os.environ.get(OUT)
    if not path or hasattr(session.config, "workerinput") or not _seconds:
        return
    tier = os.environ.get("TUNER_TIER", "unnamed")
    out = Path(path)
    recorded: dict[str, Any] = json.loads(out.read_text()) if out.exists() else {"tiers": {}}
    recorded["tiers"][tier] = {
        "wall_s": round(time.monotonic() - _started[0], 1),
        "tests": {k: round(v, 2) for k, v in sorted(_seconds.items())},
    }
    # Set by .ci/tiers: the date, the commit and the machine measured.
    for key in ("measured", "commit", "machine"):
        if os.environ.get(f"TUNER_{key.upper()}"):
            recorded[key] = os.environ[f"TUNER_{key.upper()}"]
    out.write_text(json.dumps(recorded, indent=1, sort_keys=True) + "\n")


def makespan_s(seconds: Iterable[float], workers: int = WORKERS) -> float:
    """The wall seconds ``workers`` processes take for tests of these durations, each next test
    to the first process free, longest first (the schedule a work-stealing run approaches)."""
    free = [0.0] * workers
    for duration in sorted(seconds, reverse=True):
        heapq.heappush(free, heapq.heappop(free) + duration)
    return max(free)


def file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]
