"""``tuner report`` writes a page for every kind of study tuner can leave, of either objective:
a single trial, searched trials pruned, every trial infeasible, every engine failed, a run
interrupted at its first trial or later, a trial left running by a killed run.

Each study is a real Optuna study in SQLite, filled by ``run_study`` (and ``confirm``) as
``tuner run`` fills it, with the no-spec run's spec (``DEFAULT_SPEC``) and a stand-in trial
runner (the ``runner`` seam) whose outcomes are scripted; no server runs.
"""

from __future__ import annotations

import base64
import html
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import optuna
import pytest

from tuner.cli.main import main
from tuner.load.http import ReplaySettings
from tuner.report.build import FIGURES, HTML_NAME
from tuner.study.capacity.probes import (
    CAPACITY_FAILED,
    CapacitySettings,
    capacity_score,
)
from tuner.study.capacity.rate_search import RateSearch
from tuner.study.measure import scoring
from tuner.study.measure.judge import Criteria
from tuner.study.measure.trial import TrialOutcome, TrialSetup
from tuner.study.plan.spec import DEFAULT_SPEC, StudySpec, parse_spec
from tuner.study.result.choice import choose
from tuner.study.setup.objective import CAPACITY_ATTR, OBJECTIVES
from tuner.study.store.record import BELOW_ATTR
from tuner.study.trials import fingerprint
from tuner.study.trials.confirm import again, confirm, current
from tuner.study.trials.groups import ranked
from tuner.study.trials.search import Measuring, open_study, run_study

TIMINGS = {"engine_healthy_s": 30.0, "window_s": 10.0, "engine_stop_s": 0.5, "trial_s": 45.0}
# What vLLM's defaults measure on the no-spec run's trace: far under its SLOs (2,000 ms TTFT,
# 200 ms TPOT, 60 s end to end).
SERVED = {"ttft_p95_s": 0.07, "tpot_p95_s": 0.03, "e2e_p99_s": 3.0, "error_rate": 0.0}
MISSED = SERVED | {"ttft_p95_s": 3.0}
ENGINE_FAILED = "vLLM exited with status 1"
INTERRUPT = "interrupt"  # the runner raises KeyboardInterrupt: Ctrl-C during that trial


def latency_outcome(
    kind: str, args: Mapping[str, Any], spec: StudySpec, should_stop
) -> TrialOutcome:
    """A latency trial that ended as ``kind``: feasible, infeasible, failed or pruned."""
    if kind == "failed":
        return TrialOutcome(args, scoring.FAILED, {}, {"trial_s": 5.0}, ENGINE_FAILED, "tail")
    if kind == "pruned":
        should_stop(1, 3.5)
        reached = {"ttft_p95_s": 5.0, "e2e_p99_s": 8.0}
        score = scoring.score(reached, Criteria.of(spec))
        return TrialOutcome(args, score, reached, TIMINGS, "stopped early", pruned=True)
    figures = SERVED if kind == "feasible" else MISSED
    score = scoring.score(figures, Criteria.of(spec))
    return TrialOutcome(args, score, figures, TIMINGS, None if score.feasible else "SLO missed")


def capacity_outcome(kind: str, args: Mapping[str, Any], gate: float | None) -> TrialOutcome:
    """A capacity trial that ended as ``kind``; a pruned one failed the rate it was gated at
    (the best capacity so far), stopped 3 s into it."""
    if kind == "failed":
        timings = {"trial_s": 5.0}
        return TrialOutcome(args, CAPACITY_FAILED, {CAPACITY_ATTR: 0.0}, timings, ENGINE_FAILED)
    if kind == "pruned":
        assert gate is not None  # a searched trial after a feasible one: the gate is set
        stopped = {"rate_req_per_s": gate, "passed": False, "ttft_p95_s": 5.0, "stopped_at_s": 3}
        metrics = {BELOW_ATTR: gate, "ttft_p95_s": 5.0}
        score = capacity_score(0.0)
        why = f"failed at {gate:.3g} req/s, the best capacity so far: it cannot beat that"
        return TrialOutcome(args, score, metrics, TIMINGS, why, pruned=True, points=(stopped,))
    first = SERVED if kind == "feasible" else MISSED
    points = (
        {"rate_req_per_s": 2.0, "passed": kind == "feasible", **first},
        {"rate_req_per_s": 4.0, "passed": False, **MISSED, "ttft_p95_s": 4.0},
    )
    capacity = 2.0 if kind == "feasible" else 0.0
    reason = None if capacity else "no rate met the SLOs"
    metrics = {CAPACITY_ATTR: capacity, **first}
    return TrialOutcome(args, capacity_score(capacity), metrics, TIMINGS, reason, points=points)


def fill(storage: str, mode: str, script: tuple[str, ...], repeats: int = 0) -> optuna.Study:
    """A study of ``mode`` whose trials end as ``script`` says, its fingerprint recorded as
    ``tuner run`` records it; ``repeats``: the confirm step, as a no-spec run does it."""
    spec = parse_spec(DEFAULT_SPEC | {"objective_mode": mode})
    settings = CapacitySettings(requests=(), period_s=1.0, probe_s=5.0)
    setup = TrialSetup(
        model="m",
        requests=(),
        replay=ReplaySettings(model="m", vocab_size=100),
        criteria=Criteria(spec.slos, spec.weights),
    )
    if mode == "capacity":
        setup = replace(setup, measure=RateSearch(settings))
    kinds = iter(script)

    def runner(args, setup, workdir, should_stop=None) -> TrialOutcome:
        kind = next(kinds, "feasible")  # the confirm step's: vLLM's defaults again
        if kind == INTERRUPT:
            raise KeyboardInterrupt
        if mode == "capacity":
            return capacity_outcome(kind, args, setup.measure.settings.gate_req_per_s)
        return latency_outcome(kind, args, spec, should_stop)

    study = open_study("s", storage, 0, objective=OBJECTIVES[mode])
    study.set_user_attr(fingerprint.WORKLOAD_ATTR, fingerprint.of_study(spec, {}, {}))
    run = Path("/nonexistent")
    try:
        run_study(study, spec, setup, run, len(script), runner=runner)
    except KeyboardInterrupt:
        return study
    if not (spec.confirm_top_k and repeats):
        return study
    # As ``Run.confirm`` does: the finalist's round, or, where no searched configuration met
    # the SLOs, the feasible baseline measured again to ``1 + repeats``.
    how = Measuring(setup, run, runner)
    if current(study, repeats) is not None:
        confirm(study, how, repeats)
        return study
    feasible, baseline, _ = ranked(study)
    if feasible and baseline is not None and baseline.feasible:
        again(study, baseline.number, how, 1 + repeats)
    return study


@dataclass(frozen=True)
class Kind:
    """A kind of study: how its trials end, what the page's table and verdict say, and the
    figures written beside it (a latency study's are these without ``rates.png``)."""

    script: tuple[str, ...]
    outcomes: tuple[str, ...]  # the trials table's outcome column, by trial
    latency: str  # the verdict's first words in a latency study
    capacity: str  # and in a capacity study
    figures: frozenset[str]
    repeats: int = 0  # the confirm step's, as a no-spec run's
    killed: bool = False  # a last trial begun by a run that was killed (SIGKILL), left RUNNING


EVERY = frozenset(name for name, _ in FIGURES)
KEPT = "It is vLLM's own defaults, kept"
NOT_SERVED = "No trial served the window. trial 0: "
STUDIES = {
    "a single trial": Kind(
        ("feasible",),
        ("feasible",),
        f"Trial 0 meets every SLO. {KEPT}",
        f"Trial 0 carries 2 req/s within every SLO. {KEPT}",
        EVERY - {"landscape.png"},  # nothing was searched
    ),
    # The capacity study is the no-spec run on a held-out trace that ``tuner report`` failed
    # on in matplotlib: trial 0 and its repeats complete, trials 1 and 2 pruned by the gate.
    "searched trials pruned": Kind(
        ("feasible", "pruned", "pruned"),
        ("feasible", "pruned", "pruned", "feasible", "feasible"),
        "Trial 3 meets every SLO (the median of its 3 measurements: trials 0, 3 and 4).",
        "Trial 3 carries 2 req/s within every SLO (the median of its 3 measurements: trials 0,",
        EVERY,
        repeats=2,
    ),
    "every trial infeasible": Kind(
        ("infeasible", "infeasible"),
        ("infeasible", "infeasible"),
        "No trial met the SLOs. The closest, trial 0: ttft_p95_s: 3000 ms (SLO 2000 ms)",
        "No trial met the SLOs. The closest, trial 0: no rate tried met every SLO (capacity 0)",
        EVERY,
        repeats=2,  # nothing is feasible: nothing is measured again
    ),
    "every engine failed": Kind(
        ("failed", "failed"),
        ("failed", "failed"),
        NOT_SERVED + ENGINE_FAILED,
        NOT_SERVED + ENGINE_FAILED,
        frozenset({"cost.png"}),  # their time: nothing was measured
        repeats=2,
    ),
    "interrupted at its first trial": Kind(
        (INTERRUPT,),
        ("interrupted",),
        NOT_SERVED + "interrupted: KeyboardInterrupt",
        NOT_SERVED + "interrupted: KeyboardInterrupt",
        frozenset(),
    ),
    "interrupted later": Kind(
        ("feasible", INTERRUPT),
        ("feasible", "interrupted"),
        f"Trial 0 meets every SLO. {KEPT}",
        f"Trial 0 carries 2 req/s within every SLO. {KEPT}",
        EVERY,  # the interrupted trial had drawn its values: the landscape has the axes
    ),
    "a trial left running": Kind(
        ("feasible",),
        ("feasible", "running"),
        f"Trial 0 meets every SLO. {KEPT}",
        f"Trial 0 carries 2 req/s within every SLO. {KEPT}",
        EVERY - {"landscape.png"},
        killed=True,
    ),
}


def verdict_of(page: str) -> str:
    """The verdict's paragraph, as text."""
    part = page[page.index('id="verdict"') :]
    part = part[part.index("<p>") + 3 : part.index("</p>")]
    return html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", part))).strip()


def outcomes_of(page: str) -> list[str]:
    """The trials table's outcome column, by trial."""
    table = page[page.index('id="trials-table"') :]
    table = table[: table.index("</table>")]
    column = re.findall(r"<th>([^<]*)</th>", table).index("outcome")
    rows = re.findall(r"<tr(?: class=\"chosen\")?>(<td.*?)</tr>", table)
    return [re.findall(r"<td[^>]*>([^<]*)</td>", row)[column] for row in rows]


# A goodput study's page is tests/test_goodput.py's: its windows are judged otherwise.
@pytest.mark.parametrize("mode", ["latency", "capacity"])
@pytest.mark.parametrize("name", list(STUDIES))
def test_every_kind_of_study_has_a_page(name: str, mode: str, tmp_path: Path, capsys) -> None:
    kind = STUDIES[name]
    storage = f"sqlite:///{tmp_path / 's.db'}"
    study = fill(storage, mode, kind.script, kind.repeats)
    if kind.killed:
        study.ask()
    out = tmp_path / "report"
    command = ["report", "s", "--storage", storage, "--out", str(out)]
    assert main([*command, "--configs", str(tmp_path / "configs")]) == 0
    assert capsys.readouterr().out.startswith(f"wrote {out / HTML_NAME} ")
    page = (out / HTML_NAME).read_text()
    said = kind.capacity if mode == "capacity" else kind.latency
    assert verdict_of(page).startswith(said), verdict_of(page)
    assert outcomes_of(page) == list(kind.outcomes)
    figures = kind.figures if mode == "capacity" else kind.figures - {"rates.png"}
    assert {name for name, _ in FIGURES if (out / name).exists()} == figures
    # Each figure written is embedded in the page, whole.
    images = re.findall(r'<img src="data:image/png;base64,([^"]*)"', page)
    assert len(images) == len(figures)
    for figure in figures:
        png = (out / figure).read_bytes()
        assert png.startswith(b"\x89PNG") and base64.b64encode(png).decode() in images
    # Each one not written is said to be missing, with why.
    drawn = len(EVERY) - (mode != "capacity")
    missing = re.findall(r'<p class="note">No ([^<]*: no trial to draw|parameter was searc)', page)
    assert len(figures) + len(missing) == drawn


@pytest.mark.parametrize("mode", ["latency", "capacity"])
def test_defaults_kept_over_pruned_trials_say_they_were_stopped(mode: str, tmp_path: Path) -> None:
    # Trials 1 and 2 were measured until the pruner (a capacity study: the gate) stopped them:
    # not "no other configuration was measured".
    study = fill(f"sqlite:///{tmp_path / 's.db'}", mode, ("feasible", "pruned", "pruned"), 2)
    choice = choose(study)
    assert choice is not None and choice.keeps_defaults
    assert choice.why == (
        "every searched configuration was stopped early, behind the best so far (trials 1, 2)"
    )
