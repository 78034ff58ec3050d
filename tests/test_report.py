"""``tuner report``: which trials go into which series, the page, and the command.

The studies are real Optuna studies in SQLite: one filled by ``run_study`` with a stand-in trial
runner (the ``runner`` seam) whose outcomes are scripted, one of every kind; and the committed
``benchmarks/results/cpu-demo/cpu-demo.db``, written by a real ``tuner run`` of the quick start
(read there, never written: a test copies it first).
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
from conftest import REPO, run_tuner, write_small_trace, write_spec

from tuner import build
from tuner.cli.exits import EXIT_DEFAULTS_KEPT
from tuner.errors import InputError
from tuner.load.http import ReplaySettings
from tuner.report.build import read_report, write_report
from tuner.report.data import (
    FAILED,
    FEASIBLE,
    INFEASIBLE,
    INTERRUPTED,
    PRUNED,
    SCORE,
    Parameter,
    TrialRow,
    cost,
    history,
    landscape,
    measured_by,
    not_measurement_share,
    rows_of,
    searched_parameters,
    slo_limits,
)
from tuner.report.plots import plot_landscape
from tuner.study.measure import scoring
from tuner.study.measure.trial import Criteria, TrialOutcome, TrialSetup
from tuner.study.plan.spec import parse_spec
from tuner.study.setup.objective import SCORE_NAME
from tuner.study.trials.search import load_existing, open_study, run_study

DEMO_DB = REPO / "benchmarks" / "results" / "cpu-demo" / "cpu-demo.db"
# The configuration the run of DEMO_DB wrote.
DEMO_CONFIG = REPO / "tests" / "data" / "cpu-demo.yaml"
CAPTURE = "compilation-config.max_cudagraph_capture_size"
SPEC = {
    "model": "m",
    "dummy_model": None,
    "engine_args": {"load-format": "dummy"},
    "baseline": {"gpu-memory-utilization": 0.2},
    "search_space": {
        "max-num-seqs": {"type": "int", "low": 1, "high": 32, "log": True},
        CAPTURE: {"type": "categorical", "choices": [None, 256, 512]},
    },
    "candidates": [{"max-num-seqs": 16}],
    "slos": {"ttft_p95_s": 2.0, "e2e_p99_s": 10.0},
    "weights": {"ttft_p95_s": 1.0, "e2e_p99_s": 1.0},
}
TIMINGS = {
    "engine_healthy_s": 30.0,
    "warmup_s": 1.0,
    "window_s": 10.0,
    "engine_stop_s": 0.5,
    "trial_s": 45.0,
}
# Trial by trial: 0 the baseline, 1 the candidate, then searched trials; 5 is interrupted.
SCRIPT = ("feasible", "infeasible", "failed", "pruned", "best")


def figures(ttft_p95_s: float) -> dict[str, float]:
    return {"ttft_p95_s": ttft_p95_s, "e2e_p99_s": 3.0, "error_rate": 0.0, "tpot_p95_s": 0.02}


def scripted(kind: str, args, should_stop) -> TrialOutcome:
    spec = parse_spec(SPEC)

    def judged(metrics: dict[str, float]) -> scoring.Score:
        return scoring.score(metrics, Criteria.of(spec))

    if kind == "failed":
        timings = {"engine_stop_s": 0.2, "trial_s": 5.0}
        return TrialOutcome(args, scoring.FAILED, {}, timings, "vLLM exited with status 1", "x")
    if kind == "pruned":
        should_stop(1, 3.5)
        metrics = {"ttft_p95_s": 7.0, "e2e_p99_s": 8.0}
        return TrialOutcome(args, judged(metrics), metrics, TIMINGS, "stopped early", pruned=True)
    ttft_s = {"feasible": 0.5, "infeasible": 3.0, "best": 0.3}[kind]
    outcome = judged(figures(ttft_s))
    reason = None if outcome.feasible else "SLO missed: ttft_p95_s 3000 ms"
    return TrialOutcome(args, outcome, figures(ttft_s), TIMINGS, reason)


def fill(storage: str, script: tuple[str, ...], interrupt: bool = False) -> None:
    spec = parse_spec(SPEC)
    setup = TrialSetup(
        model="m",
        requests=(),
        replay=ReplaySettings(model="m", vocab_size=100),
        criteria=Criteria(spec.slos, spec.weights),
    )
    kinds: Iterator[str] = iter(script)

    def runner(args, setup, workdir, should_stop=None) -> TrialOutcome:
        return scripted(next(kinds), args, should_stop)

    study = open_study("s", storage, 0)
    run_study(study, spec, setup, Path("/nonexistent"), len(script), runner=runner)
    if interrupt:

        def interrupted(args, setup, workdir, should_stop=None) -> TrialOutcome:
            raise KeyboardInterrupt

        with pytest.raises(KeyboardInterrupt):
            run_study(study, spec, setup, Path("/nonexistent"), 1, runner=interrupted)


@pytest.fixture(scope="module")
def storage(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The scripted study; read only by the tests that share it."""
    url = f"sqlite:///{tmp_path_factory.mktemp('scripted') / 's.db'}"
    fill(url, SCRIPT, interrupt=True)
    return url


@pytest.fixture
def demo(tmp_path: Path) -> str:
    copy = tmp_path / "demo.db"
    shutil.copy(DEMO_DB, copy)
    return f"sqlite:///{copy}"


@pytest.fixture
def demo_configs(tmp_path: Path) -> Path:
    """A configs folder holding what that run wrote, as ``configs/demo.yaml``."""
    folder = tmp_path / "configs"
    folder.mkdir()
    shutil.copy(DEMO_CONFIG, folder / "demo.yaml")
    return folder


def trials(storage: str, name: str = "s") -> list:
    return optuna.load_study(study_name=name, storage=storage).get_trials()


def numbers(points) -> list[int]:
    return [p.trial for p in points]


def test_every_trial_is_a_row_with_its_outcome_and_kind(storage: str) -> None:
    rows = rows_of(trials(storage))
    assert [r.outcome for r in rows] == [
        FEASIBLE,
        INFEASIBLE,
        FAILED,
        PRUNED,
        FEASIBLE,
        INTERRUPTED,
    ]
    assert [r.kind for r in rows][:3] == ["baseline", "candidate 0", "searched"]
    assert rows[2].reason == "vLLM exited with status 1"
    assert rows[5].reason == "interrupted: KeyboardInterrupt"
    # Only served trials have a score: not the pruned one, whose value is its last report.
    assert [r.value is not None for r in rows] == [True, True, False, False, True, False]


def test_a_landscape_of_the_defaults_alone_is_drawn(tmp_path: Path) -> None:
    # A capacity study whose searched trials the gate pruned: only vLLM's defaults measured,
    # their max-num-seqs left to vLLM (a level, not a point), on a log parameter. Its
    # landscape used to fail in matplotlib ("Data cannot be log-scaled ...").
    row = TrialRow(0, FEASIBLE, "baseline", {}, 2.0, {"ttft_p95_s": 0.2}, {})
    parameter = Parameter("max-num-seqs", numeric=True, log=True)
    path = plot_landscape([row], [parameter], {"ttft_p95_s": 1.0}, tmp_path / "l.png")
    assert path is not None and path.read_bytes().startswith(b"\x89PNG")


def test_landscape_series_take_the_trials_that_measured_the_figure(storage: str) -> None:
    rows = rows_of(trials(storage))
    ttft = landscape(rows, "max-num-seqs", "ttft_p95_s")
    assert numbers(ttft[FEASIBLE]) == [0, 4]
    assert numbers(ttft[INFEASIBLE]) == [1]
    assert numbers(ttft[PRUNED]) == [3]  # what it had reached: a lower bound
    # The baseline left max-num-seqs to vLLM: no value on the axis. The candidate ran 16.
    assert ttft[FEASIBLE][0].x is None
    assert ttft[INFEASIBLE][0].x == 16
    assert ttft[PRUNED][0].y == 7.0
    score = landscape(rows, "max-num-seqs", SCORE)
    assert numbers(score[FEASIBLE]) == [0, 4]
    assert numbers(score[INFEASIBLE]) == [1]
    assert score[PRUNED] == ()  # a pruned trial has no score
    # The failed and the interrupted trial are in no series.
    drawn = {p.trial for series in ttft.values() for p in series}
    assert drawn.isdisjoint({2, 5})


def test_searched_parameters_and_the_slos_come_from_the_study(storage: str) -> None:
    found = trials(storage)
    parameters = {p.name: p for p in searched_parameters(found)}
    assert list(parameters) == ["max-num-seqs", CAPTURE]
    assert parameters["max-num-seqs"].numeric and parameters["max-num-seqs"].log
    assert not parameters[CAPTURE].numeric
    assert slo_limits(rows_of(found)) == {"ttft_p95_s": 2.0, "e2e_p99_s": 10.0, "error_rate": 0.0}


def test_history_keeps_the_best_feasible_score_so_far(storage: str) -> None:
    rows = rows_of(trials(storage))
    steps = history(rows)
    first, best = rows[0].value, rows[4].value
    assert first is not None and best is not None and best < first
    # The infeasible candidate (trial 1) and the trials without a score never move it.
    assert [s.best_so_far for s in steps] == [first, first, first, first, best, best]
    assert [s.value is None for s in steps] == [False, False, True, True, False, True]


def test_cost_has_a_bar_per_trial_that_recorded_its_time(storage: str) -> None:
    bars = cost(rows_of(trials(storage)))
    assert [b.trial for b in bars] == [0, 1, 2, 3, 4]  # not the interrupted one
    assert bars[0].parts_s == (30.0, 1.0, 10.0, 0.5)
    assert bars[0].other_s == pytest.approx(3.5)
    assert bars[2].window_s == 0.0 and bars[2].total_s == pytest.approx(5.0)
    share = not_measurement_share(bars)
    assert share == pytest.approx(1 - 40.0 / (4 * 45.0 + 5.0))


def test_the_demo_study_splits_into_its_series() -> None:
    found = optuna.load_study(study_name="demo", storage=f"sqlite:///{DEMO_DB}").get_trials()
    rows = rows_of(found)
    seqs = landscape(rows, "max-num-seqs", "ttft_p95_s")
    assert numbers(seqs[FEASIBLE]) == [0, 1, 2, 3, 5, 7]
    assert numbers(seqs[INFEASIBLE]) == [4]
    assert numbers(seqs[PRUNED]) == [6]
    assert landscape(rows, "max-num-seqs", SCORE)[PRUNED] == ()
    assert slo_limits(rows) == {
        "ttft_p95_s": 2.0,
        "tpot_p95_s": 0.1,
        "e2e_p99_s": 15.0,
        "error_rate": 0.0,
    }
    assert len(cost(rows)) == 8


def test_the_page_puts_the_verdict_first(storage: str, tmp_path: Path) -> None:
    page = write_report("s", storage, tmp_path / "out", tmp_path / "configs").read_text()
    verdict = page[page.index('id="verdict-table"') : page.index("</table>")]
    assert page.index('id="verdict"') < page.index('id="trials"') < page.index('id="landscape"')
    # The chosen trial (vLLM's defaults, kept: every configuration was measured once), the
    # closest searched configuration, the candidate: one column each.
    header = re.findall(r"<th>(trial \d+: [^<]*)</th>", verdict)
    assert header == [
        "trial 0: best, your configuration",
        "trial 4: closest searched",
        "trial 1: candidate 0",
    ]
    assert '<td class="miss">3000 ms</td>' in verdict  # the candidate's TTFT, over its SLO
    assert "<td>2000 ms</td>" in verdict  # the SLO itself
    # No configs/s.yaml was written: the page shows trial 0's arguments and says so.
    assert "No " in page and "load-format: dummy" in page
    rows = re.findall(r"<tr(?: class=\"chosen\")?><td>(\d+)</td>", page)
    assert rows == ["0", "1", "2", "3", "4", "5"]
    assert "vLLM exited with status 1" in page and "interrupted: KeyboardInterrupt" in page
    for name in ("landscape.png", "trials.png", "history.png", "cost.png"):
        assert (tmp_path / "out" / name).read_bytes().startswith(b"\x89PNG")
    # Self-contained: every image is embedded, nothing is fetched.
    sources = re.findall(r'<img src="([^"]{0,30})', page)
    assert sources and all(s.startswith("data:image/png;base64,") for s in sources)
    assert "http://" not in page.replace("http://www.w3.org", "")


def test_the_page_names_the_build_vllm_and_device_that_measured_each_trial(
    storage: str, demo: str, tmp_path: Path
) -> None:
    study = optuna.create_study()
    measured = [
        {"tuner_build": "0.2.0 (commit 1a2b3c4)", "vllm_version": "0.26.0", "device": "H200"},
        {"tuner_build": "0.2.0 (commit 1a2b3c4)", "vllm_version": "0.26.0", "device": "H200"},
        {"vllm_version": "0.26.0", "device": "H200"},  # a build from before builds were recorded
        {"tuner_build": "0.2.0 (commit 1a2b3c4)", "vllm_version": "0.26.0", "device": "H200"},
        {"tuner_build": "0.2.0 (commit 9f8e7d6)", "vllm_version": "0.26.0", "device": "H200"},
        {},  # asked for, never started
    ]
    for attrs in measured:
        trial = study.ask()
        for key, value in attrs.items():
            trial.set_user_attr(key, value)
        study.tell(trial, 1.0)
    assert measured_by(study.get_trials()) == (
        "tuner 0.2.0 (commit 1a2b3c4), vLLM 0.26.0, H200: trials 0, 1, 3",
        "tuner (build not recorded), vLLM 0.26.0, H200: trial 2",
        "tuner 0.2.0 (commit 9f8e7d6), vLLM 0.26.0, H200: trial 4",
    )
    # The scripted study's trials were measured by this build; the demo's, from an early build,
    # recorded neither a build nor a vLLM version: the page says nothing of them.
    page = write_report("s", storage, tmp_path / "s", tmp_path / "configs").read_text()
    assert f"Measured by tuner {build.describe()}, vLLM " in page
    page = write_report("demo", demo, tmp_path / "demo", tmp_path / "configs").read_text()
    assert "Measured by" not in page


def test_the_page_shows_the_configuration_that_run_wrote(
    demo: str, demo_configs: Path, tmp_path: Path
) -> None:
    page = write_report("demo", demo, tmp_path / "out", demo_configs).read_text()
    assert "wrote trial 0 to" in page
    assert "vllm serve --config" in page and "gpu-memory-utilization: 0.2" in page


def test_the_page_says_where_a_requests_time_went(
    demo: str, demo_configs: Path, storage: str, tmp_path: Path
) -> None:
    """Tuner's client's means beside vLLM's own, for the verdict's trials; nothing where the
    trials hold no vLLM figures (the scripted study)."""
    page = write_report("demo", demo, tmp_path / "out", demo_configs).read_text()
    table = page[page.index('id="time-table"') :]
    table = table[: table.index("</table>")]
    trial = optuna.load_study(study_name="demo", storage=demo).trials[0]
    attrs = trial.user_attrs
    for label, client, server in (
        ("time to first token", "ttft_mean_s", "server_ttft_mean_s"),
        ("end to end", "e2e_mean_s", "server_e2e_mean_s"),
    ):
        row = re.search(rf"<tr><th>{label}</th>(.*?)</tr>", table)
        assert row is not None, table
        cells = re.findall(r"<td>([^<]*)</td>", row.group(1))
        assert cells[:2] == [f"{attrs[client] * 1000:.1f} ms", f"{attrs[server] * 1000:.1f} ms"]
    queue = re.search(
        r"<tr><th>  waiting in vLLM&#x27;s queue</th><td></td><td>([^<]+)</td>", table
    )
    assert queue is not None and queue.group(1) == f"{attrs['server_queue_mean_s'] * 1000:.1f} ms"
    scripted = write_report("s", storage, tmp_path / "scripted", tmp_path).read_text()
    assert "time-table" not in scripted


def test_no_served_trial_is_said_plainly(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 's.db'}"
    fill(storage, ("failed",))
    report = read_report("s", storage, tmp_path)
    assert report.chosen is None and not report.meets_slos
    page = write_report("s", storage, tmp_path / "out", tmp_path).read_text()
    assert "No trial served the window. trial 0: vLLM exited with status 1" in page
    assert not (tmp_path / "out" / "landscape.png").exists()


def test_closest_trial_when_none_meets_the_slos(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 's.db'}"
    fill(storage, ("infeasible", "infeasible"))
    page = write_report("s", storage, tmp_path / "out", tmp_path).read_text()
    assert "No trial met the SLOs. The closest, trial " in page
    assert "ttft_p95_s: 3000 ms (SLO 2000 ms)" in page


def test_open_study_names_the_objective(demo: str) -> None:
    assert optuna.load_study(study_name="demo", storage=demo).metric_names is None
    # Reopened by tuner (a resumed ``tuner run``): named, and so shown in optuna-dashboard.
    assert open_study("demo", demo, 0).metric_names == [SCORE_NAME]


def test_reading_creates_nothing(tmp_path: Path) -> None:
    missing = tmp_path / "none.db"
    with pytest.raises(InputError, match="no study database"):
        load_existing("s", f"sqlite:///{missing}")
    assert not missing.exists()


def test_report_command_writes_the_page(demo: str, tmp_path: Path) -> None:
    out = tmp_path / "report"
    done = run_tuner("report", "demo", "--storage", demo, "--out", out, cwd=REPO, timeout_s=120)
    assert done.returncode == 0, done.stderr
    page = out / "index.html"
    assert done.stdout.strip() == f"wrote {page} (open it in a browser; it needs no network)"
    assert "Verdict" in (out / "index.html").read_text()


def test_report_command_names_the_studies_there(demo: str, tmp_path: Path) -> None:
    done = run_tuner("report", "nope", "--storage", demo, cwd=tmp_path, timeout_s=120)
    assert done.returncode == 2
    assert done.stderr.strip() == f"tuner: no study 'nope' in {demo} (studies there: demo)"
    missing = run_tuner("report", "demo", cwd=tmp_path, timeout_s=120)
    assert missing.returncode == 2
    assert missing.stderr.strip() == "tuner: no study database at studies/demo.db"
    assert not (tmp_path / "studies").exists()


def test_run_ends_with_the_report_command_or_writes_it(tmp_path: Path, cpu_model: Path) -> None:
    storage = f"sqlite:///{tmp_path / 's.db'}"
    fill(storage, SCRIPT)
    spec = write_spec(tmp_path / "spec.yaml", {**SPEC, "model": str(cpu_model)})
    trace = tmp_path / "trace.csv"
    write_small_trace(trace)
    run: tuple[object, ...] = ("run", "--trace", trace, "--study", "s", "--spec", spec)
    run += ("--storage", storage, "--n-trials", "0", "--configs", tmp_path / "configs")
    done = run_tuner(*run, cwd=tmp_path, timeout_s=300)
    assert done.returncode == EXIT_DEFAULTS_KEPT, done.stderr
    last = done.stdout.strip().splitlines()[-1]
    assert last == f"report: tuner report s --storage {storage} --configs {tmp_path / 'configs'}"
    assert not (tmp_path / "reports").exists()
    done = run_tuner(*run, "--report", cwd=tmp_path, timeout_s=300)
    assert done.returncode == EXIT_DEFAULTS_KEPT, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "report: reports/s/index.html"
    page = (tmp_path / "reports" / "s" / "index.html").read_text()
    assert "wrote trial 0 to" in page  # the configuration this very run wrote
