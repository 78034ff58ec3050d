"""A goodput study: the highest rate at which at least ``goodput_share`` of the requests meet
every SLO, each on its own TTFT, TPOT and end-to-end time. The judge of one window alone, the
rate search against a stand-in server whose goodput is known (tests/test_capacity.py's, slowed
down in part above its capacity), what ``tuner run`` and ``tuner report`` say of a scripted
study, and one whole study on vLLM's CPU build.
"""

from __future__ import annotations

import dataclasses
import re

import optuna
import pytest
from cap_load import CAP_WINDOW_S, CapLoad
from conftest import run_tuner, write_small_trace, write_spec
from test_capacity import (
    CAPACITY_REQ_PER_S,
    FAST_S,
    JUDGED_FROM,
    SLOW_S,
    StandIn,
)

from tuner.cli.exits import EXIT_MISSES_SLOS
from tuner.cli.main import main
from tuner.errors import SpecError
from tuner.load.http import ReplaySettings
from tuner.load.metrics import LiveRequest, ReplayResult, RequestResult
from tuner.report import rate_plot
from tuner.report.build import HTML_NAME
from tuner.report.presenters import presenter_of
from tuner.report.rate_plot import key
from tuner.study.capacity.probes import (
    CapacitySettings,
    capacity_score,
    lost_goodput,
    measure_capacity,
    measure_rate,
)
from tuner.study.capacity.rates import RatePoint
from tuner.study.measure.judge import (
    GOODPUT_SHARE,
    SHARE_MET,
    Criteria,
    judge_goodput,
    met_share,
    request_limits,
)
from tuner.study.measure.trial import TrialOutcome, TrialSetup
from tuner.study.plan.spec import DEFAULT_SPEC, parse_spec
from tuner.study.setup.objective import (
    CAPACITY_OBJECTIVE,
    GOODPUT_OBJECTIVE,
    OBJECTIVES,
    of_spec,
    of_study,
    of_trial,
)
from tuner.study.store.record import CAPACITY_ATTR, POINTS_ATTR
from tuner.study.trials import fingerprint
from tuner.study.trials.search import open_study, run_study
from tuner.traces.model import Request

SLOS = {"ttft_p95_s": 0.5, "ttft_p50_s": 0.3, "tpot_p95_s": 0.05, "e2e_p99_s": 2.0}


def request(ttft_s: float, e2e_s: float, tokens: int = 11, error: str | None = None):
    return RequestResult(0.0, 0.0, 8, tokens, ttft_s, e2e_s, tokens, error)


# --- one window judged ----------------------------------------------------------------------


def test_each_request_is_held_to_the_lowest_slo_on_each_of_its_figures():
    assert request_limits(SLOS) == {"ttft": 0.3, "tpot": 0.05, "e2e": 2.0}


def test_a_window_is_judged_by_the_share_of_its_requests_that_met_every_slo():
    """Ten requests, six within every SLO: one over the TTFT (0.4 s is within the p95's 0.5 s,
    not the p50's 0.3 s), one over the TPOT, one over end to end, one failed. A one-token
    request has no TPOT to miss."""
    within = [request(0.1, 0.5) for _ in range(5)] + [request(0.1, 0.2, tokens=1)]
    missed = [
        request(0.4, 0.8),  # TTFT
        request(0.1, 1.1),  # TPOT: (1.1 - 0.1) / 10 = 0.1 s a token
        request(0.1, 2.5, tokens=1),  # end to end
        request(0.1, 0.5, error="HTTP 500"),
    ]
    results = ReplayResult(within + missed, duration_s=10.0)
    assert met_share(results.results, SLOS) == pytest.approx(0.6)
    criteria = Criteria(SLOS, {})
    held = judge_goodput(results, criteria, 0.6)
    assert held.passed and held.figures[SHARE_MET] == pytest.approx(0.6)
    assert held.figures[GOODPUT_SHARE] == 0.6 and held.score.value == pytest.approx(0.6)
    short = judge_goodput(results, criteria, 0.7)
    assert not short.passed and short.score.violations == ["goodput"]
    assert not judge_goodput(ReplayResult([], 10.0), criteria, 0.5).passed  # nothing met


def test_a_goodput_window_is_lost_once_more_requests_are_past_a_limit_than_the_share_allows():
    """Of 10 requests at a share of 0.8, two may miss: a third past its TTFT limit (a request
    still waiting counts with its wait so far) loses the window; one not yet sent never
    counts."""

    def waiting(sent: bool = True) -> LiveRequest:
        return LiveRequest(sent_s=0.0, sent=sent)

    slos = {"ttft_p95_s": 0.5}
    two = [waiting(), waiting(), LiveRequest(0.0, first_token_s=0.1, sent=True)]
    assert lost_goodput(1.0, two, 10, slos, 0.8) == []
    assert lost_goodput(1.0, [*two, waiting(sent=False)], 10, slos, 0.8) == []
    assert lost_goodput(1.0, [*two, waiting()], 10, slos, 0.8) == ["goodput"]
    assert lost_goodput(0.4, [*two, waiting()], 10, slos, 0.8) == []  # not past 0.5 s yet


# --- against a stand-in server ----------------------------------------------------------------


class PartlySlow(StandIn):
    """Fast at or below ``CAPACITY_REQ_PER_S`` since the last reset; above it, every fifth
    request slow (80 % within the SLOs) up to twice that rate, every request slow beyond."""

    def _delay_s(self) -> float:
        now = self.loop.time()
        self.arrivals.append(now)
        count = len(self.arrivals)
        if count < JUDGED_FROM or now <= self.arrivals[0]:
            return FAST_S
        rate = (count - 1) / (now - self.arrivals[0])
        if rate > 2 * CAPACITY_REQ_PER_S:
            return SLOW_S
        if rate > CAPACITY_REQ_PER_S:
            return SLOW_S if count % 5 == 0 else FAST_S
        return FAST_S


@pytest.fixture
def partly_slow():
    server = PartlySlow()
    try:
        yield server
    finally:
        server.close()


REPLAY = ReplaySettings(model="m", vocab_size=1000, request_timeout_s=30, drain_timeout_s=30)
WINDOW = [Request(i * 0.2, 8, 2) for i in range(5)]  # 5 req/s


@pytest.mark.vllm  # a stand-in server's windows, waited out in real time
def test_the_search_finds_a_stand_in_s_known_goodput(partly_slow):
    """At a share of 75 % the stand-in's goodput is twice its capacity by percentiles: between
    10 and 20 req/s a fifth of its requests are slow, which a p95 does not let through and a
    share of 75 % does."""
    settings = CapacitySettings(
        WINDOW,
        period_s=1.0,
        probe_s=2.0,
        resolution=0.25,
        max_probes=8,
        min_requests=0,
        goodput_share=0.75,
    )
    found = measure_capacity(partly_slow.url, settings, REPLAY, Criteria({"ttft_p95_s": 0.5}, {}))
    rates = [(round(p.rate_req_per_s, 2), p.passed) for p in found.points]
    goodput = 2 * CAPACITY_REQ_PER_S
    assert found.resolved, (rates, found.why_stopped)
    # Within the resolution below the boundary, itself at most 5 % below the known rate.
    assert goodput * 0.95 / (1 + settings.resolution) <= found.capacity_req_per_s, rates
    assert found.capacity_req_per_s <= goodput * 1.01, rates
    best = found.best_point
    assert best is not None and best.figures[SHARE_MET] >= 0.75
    assert all(p.figures[GOODPUT_SHARE] == 0.75 for p in found.points)
    failed = [p for p in found.points if not p.passed]
    assert failed and all("short of 75%" in (p.reason or "") or "lost" in (p.reason or "")
                          for p in failed), rates  # fmt: skip


@pytest.mark.vllm  # a stand-in server's windows, waited out in real time
def test_one_rate_above_the_capacity_passes_at_a_low_share_only(partly_slow):
    """At 15 req/s a fifth of the requests are slow: 90 % is not met, 75 % is."""
    criteria = Criteria({"ttft_p95_s": 0.5}, {})
    rate = 1.5 * CAPACITY_REQ_PER_S
    settings = CapacitySettings(WINDOW, period_s=1.0, probe_s=2.0, min_requests=0)
    for share, passed in ((0.9, False), (0.75, True)):
        point = measure_rate(
            partly_slow.url, dataclasses.replace(settings, goodput_share=share), REPLAY, criteria,
            rate,
        )  # fmt: skip
        assert point.passed == passed, (share, point)
        assert 0.75 <= point.figures[SHARE_MET] < 0.9, point


# --- the spec, the objective, what tuner run and tuner report say ------------------------------


def test_goodput_share_is_a_share_above_0():
    assert parse_spec(DEFAULT_SPEC | {"goodput_share": 1}).goodput_share == 1.0
    for bad in (0, -0.1, 1.5, "most"):
        with pytest.raises(SpecError, match="goodput_share"):
            parse_spec(DEFAULT_SPEC | {"goodput_share": bad})


def test_a_goodput_study_is_its_own_objective_and_fingerprint():
    spec = parse_spec(DEFAULT_SPEC | {"objective_mode": "goodput", "goodput_share": 0.8})
    objective = of_spec(spec)
    assert objective is GOODPUT_OBJECTIVE and list(OBJECTIVES)[-1] == "goodput"
    recorded = fingerprint.of_study(spec, {}, {})
    assert recorded["objective_mode"] == "goodput" and recorded["goodput_share"] == 0.8
    other = parse_spec(DEFAULT_SPEC | {"objective_mode": "goodput", "goodput_share": 0.9})
    assert fingerprint.of_study(other, {}, {}) != recorded
    capacity = parse_spec(DEFAULT_SPEC | {"objective_mode": "capacity"})
    assert "goodput_share" not in fingerprint.of_study(capacity, {}, {})


def goodput_outcome(rate: float, share: float = 0.9) -> TrialOutcome:
    """A goodput trial that passed at ``rate`` (none: 0) and missed twice that rate."""
    met = {"ttft_p95_s": 0.8, SHARE_MET: 0.95, GOODPUT_SHARE: share}
    missed = {"ttft_p95_s": 3.0, SHARE_MET: 0.5, GOODPUT_SHARE: share}
    points = (
        RatePoint(rate or 1.0, rate > 0, met if rate else missed),
        RatePoint(2 * (rate or 1.0), False, missed, "50% of requests met every SLO, short of 90%"),
    )
    metrics = {CAPACITY_ATTR: rate, "capacity_windows": 2.0, **(met if rate else missed)}
    return TrialOutcome(
        {}, capacity_score(rate), metrics, {}, None if rate else "no rate met the SLOs",
        points=tuple(p.as_attr() for p in points),
    )  # fmt: skip


def test_a_goodput_study_is_written_and_reported_as_goodput(
    tmp_path, cpu_model, capsys, monkeypatch
):
    """A scripted goodput study (the baseline, then a configuration of more goodput): ``tuner
    run`` says its goodput and writes it into the YAML header; ``tuner report`` leads with it and
    draws the share of requests within every SLO against offered rate, its key in goodput's
    words."""
    legends: list[str] = []
    saved = rate_plot.save

    def keep_legends(fig, path):
        for legend in fig.legends:
            legends.extend(t.get_text() for t in [legend.get_title(), *legend.get_texts()])
        return saved(fig, path)

    monkeypatch.setattr(rate_plot, "save", keep_legends)
    spec_raw = {
        "model": str(cpu_model),
        "dummy_model": None,
        "engine_args": {"load-format": "dummy"},
        "search_space": {"max-num-seqs": {"type": "int", "low": 1, "high": 32}},
        "slos": {"ttft_p95_s": 2.0},
        "weights": {"ttft_p95_s": 1.0},
        "window_s": 5,
        "objective_mode": "goodput",
        "confirm_repeats": 0,
    }
    spec_path = write_spec(tmp_path / "spec.yaml", spec_raw)
    spec = parse_spec(spec_raw)
    trace = write_small_trace(tmp_path / "trace.csv")
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    # vLLM's defaults meet no rate: the searched configuration of the most goodput is written,
    # unconfirmed (exit 3: the spec turns the confirmation off, so nothing tested it).
    script = iter([goodput_outcome(0.0), goodput_outcome(2.5), goodput_outcome(1.5)])

    def runner(args, setup, workdir, should_stop=None) -> TrialOutcome:
        return dataclasses.replace(next(script), engine_args=args)

    setup = TrialSetup(
        model=spec.model, requests=(), replay=ReplaySettings(model="m", vocab_size=100),
        criteria=Criteria(spec.slos, spec.weights),
    )  # fmt: skip
    study = open_study("gp", storage, 0, objective=GOODPUT_OBJECTIVE)
    run_study(study, spec, setup, tmp_path / "runs", 3, runner=runner)
    assert of_study(study) is GOODPUT_OBJECTIVE
    assert {of_trial(t) for t in study.get_trials()} == {GOODPUT_OBJECTIVE}
    configs = tmp_path / "configs"
    assert main([
        "run", "--trace", str(trace), "--study", "gp", "--spec", str(spec_path),
        "--storage", storage, "--n-trials", "0", "--configs", str(configs),
    ]) == EXIT_MISSES_SLOS  # fmt: skip
    out = capsys.readouterr().out
    header = (configs / "gp.yaml").read_text()
    assert re.search(r"goodput\s+2\.5 req/s\s+0 req/s", out), out
    assert (
        "# goodput: 2.5 req/s (0.625x the trace's peak rate; defaults 0 req/s); the highest "
        "rate with 90% of requests within every SLO"
    ) in header, header
    assert "# Measured each at its own goodput (this configuration at 2.5 req/s" in header
    report = tmp_path / "report"
    assert main(["report", "gp", "--storage", storage, "--out", str(report),
                 "--configs", str(configs)]) == 0  # fmt: skip
    page = (report / HTML_NAME).read_text()
    assert "carries 2.5 req/s with 90% of its requests within every SLO" in page
    assert "the highest goodput of the 2 trials that met them at some rate" in page
    assert "<th>goodput (req/s, higher is better)</th>" in page
    assert "<th>goodput</th><th>rates measured</th>" in page
    assert "requests within every SLO (share), TTFT p95" in page
    assert "the star is the configuration's goodput" in page
    assert (report / "rates.png").read_bytes().startswith(b"\x89PNG")
    assert "goodput (highest rate with enough requests within every SLO)" in legends, legends
    assert "configurations, highest goodput first" in legends, legends
    assert not [text for text in legends if "capacity" in text], legends


def test_the_rate_figure_s_key_names_each_objective_s_star():
    assert key(presenter_of(GOODPUT_OBJECTIVE))[1][3] == (
        "goodput (highest rate with enough requests within every SLO)"
    )
    assert key(presenter_of(CAPACITY_OBJECTIVE))[1][3] == "capacity (highest rate passed)"
    assert key()[1] == key(presenter_of(CAPACITY_OBJECTIVE))[1]


def test_the_command_line_offers_every_objective(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    help_text = capsys.readouterr().out
    assert "{" + ",".join(OBJECTIVES) + "}" in help_text


# --- a whole study on vLLM's CPU build --------------------------------------------------------


@pytest.mark.vllm
@pytest.mark.xdist_group("cap-load")
def test_a_goodput_study_on_vllm_finds_a_rate_and_writes_it(cap_load: CapLoad, tmp_path) -> None:
    """vLLM's CPU build, cpu-tiny, the baseline and one configuration, each searching a few
    rates (the load and SLOs from what this machine serves, the capacity study's ``cap_load``):
    the study's value is a rate that a window passed with 90 % of its requests within every
    SLO, the YAML says its goodput and the report builds."""
    alone, load = cap_load.alone, cap_load.load
    spec = (
        cap_load.spec
        | load
        | {
            "model": str(cap_load.model),
            "objective_mode": "goodput",
            "goodput_share": 0.9,
            "candidates": [{"max-num-seqs": 16, "gpu-memory-utilization": 0.2}],
            "n_trials": 2,
            "warmup_requests": 2,
            "window_s": CAP_WINDOW_S,
            "capacity_resolution": 0.5,
            "capacity_min_requests": 10,
            "capacity_max_probes": 4,
            "confirm_repeats": 0,
        }
    )
    spec_file = write_spec(tmp_path / "gp.yaml", spec)
    budget_s = 2 * (2 * alone.healthy_s + 4 * cap_load.drained_s()) + 120
    done = run_tuner(
        "run", "--trace", cap_load.trace, "--study", "gp", "--spec", spec_file, cwd=tmp_path,
        timeout_s=budget_s,
    )  # fmt: skip
    said = f"{alone}\n{load}\n{done.stdout}"
    assert done.returncode in (0, 3, 4), said + done.stderr
    study = optuna.load_study(study_name="gp", storage=f"sqlite:///{tmp_path}/studies/gp.db")
    assert of_study(study) is GOODPUT_OBJECTIVE
    firsts = study.get_trials()[:2]
    for trial in firsts:
        attrs = trial.user_attrs
        assert trial.value == attrs[CAPACITY_ATTR], attrs
        points = attrs[POINTS_ATTR]
        assert all(p[GOODPUT_SHARE] == 0.9 and SHARE_MET in p for p in points), points
        passed = [p["rate_req_per_s"] for p in points if p["passed"]]
        assert trial.value == max(passed, default=0.0)
        assert all(p[SHARE_MET] >= 0.9 for p in points if p["passed"])
    assert max(t.value or 0.0 for t in firsts) > 0, said
    header = (tmp_path / "configs" / "gp.yaml").read_text()
    assert re.search(r"^# goodput: [\d.]+ req/s \(", header, re.M), header
    assert "goodput" in done.stdout
    report = run_tuner("report", "gp", "--out", tmp_path / "report", cwd=tmp_path)
    assert report.returncode == 0, report.stdout + report.stderr
    assert "goodput (req/s, higher is better)" in (tmp_path / "report" / HTML_NAME).read_text()
