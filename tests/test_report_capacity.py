"""``tuner report`` on a capacity study: each configuration's rates as series, the figure of
latency against offered rate, and a page that puts the capacity first.

The series are checked on rows built by hand. The page is written from a real Optuna study
(SQLite) filled by ``run_study`` with a stand-in trial runner (the ``runner`` seam): each
configuration is a server of a known knee, measured by the real rate search
(``search_capacity``) through a scripted ``measure``; no server runs.
"""

from __future__ import annotations

import base64
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from test_report import SCRIPT, fill

from tuner.cli.main import main
from tuner.load.http import ReplaySettings
from tuner.report.build import read_report, write_report
from tuner.report.data import (
    CAPACITY,
    FEASIBLE,
    INFEASIBLE,
    Parameter,
    TrialRow,
    history,
    recorded_slos,
)
from tuner.report.page import fmt, rates_caption
from tuner.report.rate_curves import (
    MISSED,
    MOST_CURVES,
    PASSED,
    STOPPED,
    curve_of,
    curves,
    label,
    points_of,
    rate_metrics,
)
from tuner.report.rate_plot import plot_rates
from tuner.study.capacity.probes import CAPACITY_FAILED, capacity_score
from tuner.study.capacity.rates import COMPLETED, RatePoint, search_capacity
from tuner.study.measure.trial import Criteria, TrialOutcome, TrialSetup
from tuner.study.plan.spec import parse_spec
from tuner.study.setup.objective import CAPACITY_OBJECTIVE
from tuner.study.store.record import CAPACITY_ATTR, RATES_ATTR
from tuner.study.trials import fingerprint
from tuner.study.trials.search import open_study, run_study

SEQS = "max-num-seqs"
CAPTURE = "compilation-config.max_cudagraph_capture_size"
PARAMETERS = (Parameter(SEQS, True, True), Parameter(CAPTURE, False, False))
SLOS = {"ttft_p95_s": 2.0, "e2e_p99_s": 10.0}
SPEC = {
    "model": "m",
    "dummy_model": None,
    "engine_args": {"load-format": "dummy"},
    "search_space": {
        SEQS: {"type": "int", "low": 1, "high": 256, "log": True},
        CAPTURE: {"type": "categorical", "choices": [None, 256, 512]},
    },
    "candidates": [{SEQS: 16}],
    "slos": SLOS,
    "weights": {"ttft_p95_s": 1.0},
    "objective_mode": "capacity",
}


# --- the series, on rows built by hand ----------------------------------------------------


def point(rate: float, passed: bool, ttft_s: float, **more: Any) -> dict[str, Any]:
    return {"rate_req_per_s": rate, "passed": passed, "ttft_p95_s": ttft_s, **more}


def row(
    number: int,
    points: list[dict[str, Any]],
    kind: str = "searched",
    args: Mapping[str, Any] | None = None,
) -> TrialRow:
    capacity = max((p["rate_req_per_s"] for p in points if p["passed"]), default=0.0)
    figures = {CAPACITY_ATTR: capacity, RATES_ATTR: len(points)}
    return TrialRow(
        number=number,
        outcome=FEASIBLE if capacity else INFEASIBLE,
        kind=kind,
        engine_args=dict(args or {}),
        value=capacity,
        figures=figures,
        constraints={"no_rate_met_slos": 0.0 if capacity else 1.0},
        points=tuple(points),
    )


# Measured in the search's order: the start, double (lost within seconds), then bisection.
MEASURED = [
    point(4.0, True, 0.5, e2e_p99_s=4.0, tpot_p95_s=0.03, requests=120),
    point(8.0, False, 6.0, e2e_p99_s=9.0, stopped_at_s=3.0, reason="stopped 3 s in: lost"),
    point(5.66, False, 2.6, e2e_p99_s=8.0, tpot_p95_s=0.05, reason="missed slo_ttft_p95_s"),
    point(4.76, True, 1.4, e2e_p99_s=6.0, tpot_p95_s=0.04),
]


def test_a_trials_rates_are_in_rate_order_and_split_by_how_they_ended() -> None:
    points = points_of(row(3, MEASURED).points)
    assert [p.rate_req_per_s for p in points] == [4.0, 4.76, 5.66, 8.0]
    assert [p.mark for p in points] == [PASSED, PASSED, MISSED, STOPPED]
    assert points[0].figure("requests") == 120.0 and points[0].figure("passed") is None
    assert points[3].reason == "stopped 3 s in: lost" and points[3].figure("stopped_at_s") == 3
    curve = curve_of(row(3, MEASURED), PARAMETERS)
    assert curve is not None and curve.capacity_req_per_s == 4.76
    assert curve.line("ttft_p95_s") == ((4.0, 0.5), (4.76, 1.4), (5.66, 2.6), (8.0, 6.0))
    ttft = curve.series("ttft_p95_s")
    assert ttft == {
        PASSED: ((4.0, 0.5), (4.76, 1.4)),
        MISSED: ((5.66, 2.6),),
        STOPPED: ((8.0, 6.0),),  # a lower bound: what it had reached when stopped
    }
    # The stopped window measured no TPOT: it is in no series of that panel.
    assert curve.series("tpot_p95_s")[STOPPED] == ()
    assert [x for x, _ in curve.line("tpot_p95_s")] == [4.0, 4.76, 5.66]
    # The capacity is marked at the highest rate passed, at what it measured there.
    assert curve.capacity_mark("ttft_p95_s") == (4.76, 1.4)
    assert curve.capacity_mark("e2e_p99_s") == (4.76, 6.0)


def test_a_saturating_window_is_no_rate_of_the_curve() -> None:
    """A study's first search begins with a window far above the rest, its latencies its
    queue's: kept on the trial, not drawn (it would squeeze every other rate to the left)."""
    saturating = point(128.0, False, 17.0, stopped_at_s=19.6, **{COMPLETED: 6.0})
    curve = curve_of(row(0, [saturating, *MEASURED], kind="baseline"), PARAMETERS)
    assert curve is not None
    assert [p.rate_req_per_s for p in curve.points] == [4.0, 4.76, 5.66, 8.0]


def test_a_trial_that_passed_no_rate_has_no_capacity_mark_and_one_without_rates_no_curve():
    none_passed = curve_of(row(1, [point(1.0, False, 3.0), point(0.5, False, 2.5)]), ())
    assert none_passed is not None and none_passed.capacity_req_per_s == 0.0
    assert none_passed.capacity_mark("ttft_p95_s") is None
    assert [p.rate_req_per_s for p in none_passed.points] == [0.5, 1.0]
    assert curve_of(row(2, []), PARAMETERS) is None  # its engine failed: no rate measured


def test_labels_name_the_baseline_or_the_searched_values_briefly() -> None:
    assert label(row(0, MEASURED, kind="baseline", args={SEQS: 4}), PARAMETERS) == (
        "trial 0 (baseline)"
    )
    assert label(row(3, MEASURED, args={SEQS: 16}), PARAMETERS) == (
        "trial 3: max-num-seqs=16, max_cudagraph_capture_size=default"
    )
    # The values that do not fit go, whole.
    many = (*PARAMETERS, Parameter("max-num-batched-tokens", True, True))
    args = {SEQS: 16, CAPTURE: 512, "max-num-batched-tokens": 8192}
    assert label(row(3, MEASURED, args=args), many) == (
        "trial 3: max-num-seqs=16, max_cudagraph_capture_size=512, …"
    )
    assert label(row(3, MEASURED, args={SEQS: 16}), PARAMETERS[:1]) == "trial 3: max-num-seqs=16"
    assert label(row(3, MEASURED), ()) == "trial 3"


def test_the_highest_capacities_and_the_baseline_are_drawn_the_rest_named() -> None:
    # Twelve configurations: trial n carries n + 1 req/s, trial 9 as much as trial 10; the
    # baseline (trial 0) carries the least.
    capacities = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 11.0, 11.0, 12.0]
    rows = [
        row(
            n, [point(c, True, 0.5), point(2 * c, False, 4.0)], "baseline" if n == 0 else "searched"
        )
        for n, c in enumerate(capacities)
    ] + [row(12, [])]  # an engine that failed
    drawn = curves(rows, PARAMETERS, SLOS)
    assert [c.trial for c in drawn.curves] == [11, 9, 10, 8, 7, 6, 5, 4, 0]
    assert [c.capacity_req_per_s for c in drawn.curves][:3] == [12.0, 11.0, 11.0]
    assert drawn.left_out == (1, 2, 3)
    assert drawn.curves[-1].baseline and drawn.curves[-1].label == "trial 0 (baseline)"
    assert drawn.metrics == ("ttft_p95_s", "e2e_p99_s")
    caption = rates_caption(drawn)
    assert caption.startswith("TTFT p95 and E2E p99 of each configuration")
    assert caption.endswith(
        "the 8 configurations of the highest capacity and the baseline; left out, with less "
        "capacity: trials 1, 2 and 3 (see the table)."
    )
    # A baseline among the highest takes no extra line.
    few = curves(rows[:MOST_CURVES], PARAMETERS, SLOS, most=4)
    assert [c.trial for c in few.curves] == [7, 6, 5, 4, 0]
    assert few.left_out == (1, 2, 3)
    # A baseline of the highest capacity: drawn first, among the eight.
    top = curves([row(0, [point(20.0, True, 0.5)], "baseline"), *rows[1:10]], PARAMETERS, SLOS)
    assert len(top.curves) == MOST_CURVES and top.curves[0].baseline
    assert top.left_out == (1, 2)
    assert rates_caption(top).endswith(
        "highest capacity (the baseline among them); left out, with less capacity: trials 1 "
        "and 2 (see the table)."
    )
    assert curves(rows[1:4], PARAMETERS, SLOS).left_out == ()


def test_the_panels_follow_the_latency_slos() -> None:
    assert rate_metrics(SLOS) == ("ttft_p95_s", "e2e_p99_s")
    assert rate_metrics({"tpot_p95_s": 0.1}) == ("ttft_p95_s", "tpot_p95_s")
    every = {"ttft_p95_s": 2.0, "tpot_p95_s": 0.1, "e2e_p99_s": 10.0}
    assert rate_metrics(every) == ("ttft_p95_s", "tpot_p95_s", "e2e_p99_s")
    assert rate_metrics({}) == ("ttft_p95_s", "e2e_p99_s")


def test_the_best_so_far_of_a_capacity_study_is_the_highest() -> None:
    rows = [
        row(0, [point(2.0, True, 0.5)]),
        row(1, [point(5.0, True, 0.5)]),
        row(2, [point(1.0, False, 3.0)]),  # infeasible: never the best
        row(3, [point(3.0, True, 0.5)]),
    ]
    steps = history(rows, CAPACITY_OBJECTIVE)
    assert [s.value for s in steps] == [2.0, 5.0, 0.0, 3.0]
    assert [s.best_so_far for s in steps] == [2.0, 5.0, 5.0, 5.0]
    # The same values in a latency study: the lowest score is the best.
    assert [s.best_so_far for s in history(rows)] == [2.0, 2.0, 2.0, 2.0]


def test_a_capacity_is_a_rate_not_seconds() -> None:
    assert fmt(CAPACITY, 2.5) == "2.5 req/s" and fmt(CAPACITY, 11.24) == "11.2 req/s"
    assert fmt("ttft_p95_s", 2.5) == "2500 ms"


def test_the_slos_come_from_the_studys_fingerprint() -> None:
    spec = parse_spec(SPEC)
    recorded = {fingerprint.WORKLOAD_ATTR: fingerprint.of_study(spec, {}, {})}
    assert recorded_slos(recorded) == {"ttft_p95_s": 2.0, "e2e_p99_s": 10.0, "error_rate": 0.0}
    assert recorded_slos({}) == {}
    assert recorded_slos({fingerprint.WORKLOAD_ATTR: {"window_s": 10.0}}) == {}


# --- a scripted capacity study, reported ----------------------------------------------------


def knee_of(args: Mapping[str, Any]) -> float:
    """The stand-in server's knee: more sequences carry more up to 64, then less; vLLM's
    default (the baseline) carries 3 req/s."""
    seqs = args.get(SEQS)
    if seqs is None:
        return 3.0
    return 1.0 + min(seqs, 64) ** 0.5 - max(0.0, math.log2(seqs / 64))


def measured(knee: float, slos: Mapping[str, float]):
    """``measure`` of a server with this knee: latency grows steeply past it, and a rate far
    past it is stopped early (its figures then lower bounds)."""

    def measure(rate: float) -> RatePoint:
        load = rate / knee
        figures = {"ttft_p95_s": 0.3 + 1.2 * load**4, "e2e_p99_s": 3.0 + 5.0 * load**3}
        figures |= {"tpot_p95_s": 0.02 * (1 + load), "error_rate": 0.0, "requests": 10 * rate}
        if figures["ttft_p95_s"] > 3 * slos["ttft_p95_s"]:
            lost = {k: v / 2 for k, v in figures.items()} | {"stopped_at_s": 4.0}
            return RatePoint(rate, False, lost, "stopped 4 s in: ttft_p95_s lost")
        missed = [m for m, limit in slos.items() if figures[m] > limit]
        return RatePoint(
            rate, not missed, figures, f"missed {', '.join(missed)}" if missed else None
        )

    return measure


def outcome(args: Mapping[str, Any], slos: Mapping[str, float]) -> TrialOutcome:
    measure = measured(knee_of(args), slos)
    found = search_capacity(measure, 2.0, 0.1, max_probes=7, floor_req_per_s=0.5)
    shown = found.best_point or found.lowest_point
    assert shown is not None
    metrics = dict(shown.figures) | {
        CAPACITY_ATTR: found.capacity_req_per_s,
        "capacity_windows": float(len(found.points)),
        "capacity_resolved": float(found.resolved),
    }
    timings = {"engine_healthy_s": 30.0, "window_s": 30.0 * len(found.points), "trial_s": 400.0}
    return TrialOutcome(
        args,
        capacity_score(found.capacity_req_per_s),
        metrics,
        timings,
        None if found.capacity_req_per_s else f"no rate met the SLOs: {found.why_stopped}",
        points=tuple(p.as_attr() for p in found.points),
    )


def capacity_study(
    storage: str, n_trials: int, spec_raw: Mapping[str, Any] = SPEC, fails: int | None = None
) -> None:
    """A capacity study of ``n_trials`` through ``run_study``, its fingerprint recorded as
    ``tuner run`` records it; trial ``fails``'s engine fails."""
    spec = parse_spec(dict(spec_raw))
    setup = TrialSetup(
        model="m",
        requests=(),
        replay=ReplaySettings(model="m", vocab_size=100),
        criteria=Criteria(spec.slos, spec.weights),
    )

    calls = []

    def runner(args, setup, workdir, should_stop=None) -> TrialOutcome:
        calls.append(args)
        if len(calls) - 1 == fails:
            return TrialOutcome(args, CAPACITY_FAILED, {CAPACITY_ATTR: 0.0}, {}, "vLLM exited")
        return outcome(args, setup.criteria.slos)

    study = open_study("cap", storage, 0, objective=CAPACITY_OBJECTIVE)
    study.set_user_attr(fingerprint.WORKLOAD_ATTR, fingerprint.of_study(spec, {}, {}))
    run_study(study, spec, setup, Path("/nonexistent"), n_trials, runner=runner)


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Twelve trials, one of them an engine that fails; read only by the tests that share it."""
    url = f"sqlite:///{tmp_path_factory.mktemp('capacity') / 'cap.db'}"
    capacity_study(url, 12, fails=2)
    return url


def images_of(page: str) -> list[bytes]:
    """Every image the page shows, decoded: each must be a whole PNG."""
    sources = re.findall(r'<img src="([^"]*)"', page)
    assert sources and all(s.startswith("data:image/png;base64,") for s in sources)
    return [
        base64.b64decode(s.removeprefix("data:image/png;base64,"), validate=True) for s in sources
    ]


def test_the_capacity_figure_is_drawn_from_the_study(study: str, tmp_path: Path) -> None:
    report = read_report("cap", study, tmp_path)
    assert report.objective is CAPACITY_OBJECTIVE and report.slos == SLOS | {"error_rate": 0.0}
    drawn = curves(report.rows, report.parameters, report.slos)
    served = [r for r in report.rows if r.points]
    assert len(served) == 11 and len(drawn.curves) + len(drawn.left_out) == 11
    assert len(drawn.curves) in (MOST_CURVES, MOST_CURVES + 1)
    assert any(c.baseline for c in drawn.curves)
    assert 2 not in {c.trial for c in drawn.curves} | set(drawn.left_out)  # the failed engine
    # The curves are the search's windows, and their capacity the trial's value.
    by_number = {r.number: r for r in report.rows}
    for curve in drawn.curves:
        assert curve.capacity_req_per_s == by_number[curve.trial].value
        assert len(curve.points) == by_number[curve.trial].figures[RATES_ATTR]
    assert any(p.mark == STOPPED for c in drawn.curves for p in c.points)
    path = plot_rates(drawn, report.slos, tmp_path / "rates.png")
    assert path is not None and path.read_bytes().startswith(b"\x89PNG")


def test_the_page_puts_the_capacity_first(study: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    page = write_report("cap", study, out, tmp_path / "configs").read_text()
    report = read_report("cap", study, tmp_path)
    best = next(r for r in report.rows if r.number == report.chosen)
    # Measured once each and never on fresh engines, the highest capacity is no evidence
    # against vLLM's defaults: they are kept, and the closest searched configuration is the
    # finalist, the highest.
    assert best.number == report.baseline == 0 and report.closest is not None
    closest = next(r for r in report.rows if r.number == report.closest)
    assert closest.value == max(r.value or 0.0 for r in report.rows)
    said = f"Trial {best.number} carries {fmt(CAPACITY, best.value)} within every SLO"
    kept = f"It is vLLM's own defaults, kept: the finalist, trial {closest.number} ("
    unconfirmed = "was not measured on fresh engines (the time budget held none"
    assert said in page and kept in page and unconfirmed in page
    verdict = page[page.index('id="verdict-table"') : page.index("</table>")]
    headers = re.findall(r"<tr><th>([^<]*)</th>", verdict)
    assert headers[1:3] == ["capacity (req/s, higher is better)", "rates measured"]
    assert "score" not in verdict
    trials = page[page.index('id="trials-table"') :]
    trials = trials[: trials.index("</table>")]
    head = re.findall(r"<th>([^<]*)</th>", trials)
    assert head[head.index("outcome") + 1 : head.index("outcome") + 3] == [
        "capacity",
        "rates measured",
    ]
    assert "score" not in head
    assert f"<td>{fmt(CAPACITY, best.value)}</td>" in trials
    # The figure, embedded and beside the page; every image on the page a whole PNG.
    assert page.index('id="trials"') < page.index('id="rates"') < page.index('id="landscape"')
    assert 'title="rates.png"' in page
    for name in ("rates.png", "landscape.png", "trials.png", "history.png", "cost.png"):
        assert (out / name).read_bytes().startswith(b"\x89PNG")
    images = images_of(page)
    assert len(images) == 5 and all(image.startswith(b"\x89PNG") for image in images)
    assert (out / "rates.png").read_bytes() in images
    assert "left out, with less capacity: trials " in page


def test_tuner_report_on_a_capacity_study(study: str, tmp_path: Path, capsys) -> None:
    out = tmp_path / "report"
    (out).mkdir()
    (out / "rates.png").write_bytes(b"stale")
    assert main(["report", "cap", "--storage", study, "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip().startswith(f"wrote {out / 'index.html'}")
    page = (out / "index.html").read_text()
    assert "Latency against offered rate" in page
    assert (out / "rates.png").read_bytes() in images_of(page)


def test_a_latency_study_has_no_capacity_figure(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 's.db'}"
    fill(storage, SCRIPT)
    out = tmp_path / "out"
    out.mkdir()
    (out / "rates.png").write_bytes(b"from a report of another study")
    page = write_report("s", storage, out, tmp_path).read_text()
    assert 'id="rates"' not in page and not (out / "rates.png").exists()
    assert "score (lower is better)" in page and "rates measured" not in page


def test_no_rate_met_in_any_trial(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'cap.db'}"
    capacity_study(storage, 2, SPEC | {"slos": {"ttft_p95_s": 0.01}, "candidates": []})
    page = write_report("cap", storage, tmp_path / "out", tmp_path).read_text()
    assert "No trial met the SLOs. The closest, trial 0: no rate tried met every SLO" in page
    assert (tmp_path / "out" / "rates.png").exists()  # the rates it tried, every one missed
