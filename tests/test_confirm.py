"""The confirmation and its verdict: the search's finalist (the best searched configuration by
its search measurements) against the baseline on fresh engines, in ABBA order, stopped at the
first fresh pair that does not favour the finalist; the finalist is written only where each of
its fresh measurements beats each of the baseline's, three of each at least.

Studies are real Optuna studies in SQLite, filled through ``run_study`` and ``confirm`` with a
stand-in runner whose scores are scripted per configuration and measurement; ``tuner run
--n-trials 0`` then writes the configuration, as after a real run.
"""

from __future__ import annotations

import math
import re
import shutil
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

import optuna
import pytest
from conftest import REPO, cpu_spec, run_tuner, write_small_trace, write_spec

from tuner.cli.exits import EXIT_DEFAULTS_KEPT, EXIT_MISSES_SLOS, MEETS_SLOS_EXITS
from tuner.cli.main import main
from tuner.load.health import CLIENT_BEHIND
from tuner.load.http import ReplaySettings
from tuner.report.build import read_report, write_report
from tuner.study.measure.scoring import FAILED, Score, score
from tuner.study.measure.trial import Criteria, TrialOutcome, TrialSetup
from tuner.study.plan.spec import parse_spec
from tuner.study.result.choice import DEFAULTS, MISSES, TUNED, UNCONFIRMED, changed, choose
from tuner.study.store.record import CONFIRMS_ATTR, FRESH_ATTR
from tuner.study.trials import picks
from tuner.study.trials.confirm import again, confirm, current
from tuner.study.trials.groups import groups, ranked
from tuner.study.trials.search import Measuring, open_study, run_study

SLO_S = 2.0


def spec_dict(model: Path, **overrides: Any) -> dict[str, Any]:
    spec = {
        "model": str(model),
        "dummy_model": None,
        "engine_args": {"load-format": "dummy"},
        "search_space": {"max-num-seqs": {"type": "int", "low": 1, "high": 32}},
        "candidates": [{"max-num-seqs": 4}, {"max-num-seqs": 8}],
        "slos": {"ttft_p95_s": SLO_S},
        "weights": {"ttft_p95_s": 1.0},
        "window_s": 5,
    }
    return spec | overrides


class Scripted:
    """Scores by configuration (max-num-seqs, None for the baseline) and measurement."""

    def __init__(
        self,
        scores: Mapping[int | None, Sequence[float]],
        behind: Sequence[int | None] = (),
        behind_at: Collection[int] = (),
    ) -> None:
        self.scores = {k: list(v) for k, v in scores.items()}
        # Configurations whose re-measurements are flagged as trial.py flags a window whose
        # client fell behind (their first measurement is not).
        self.behind = set(behind)
        # Measurements flagged so by their place in the run (0: the study's first trial).
        self.behind_at = set(behind_at)
        self.order: list[int | None] = []

    def __call__(self, args, setup, workdir, should_stop=None) -> TrialOutcome:
        seqs = args.get("max-num-seqs")
        again = seqs in self.order
        at = len(self.order)
        self.order.append(seqs)
        value = self.scores[seqs].pop(0)
        if math.isnan(value):  # an engine that did not start
            return TrialOutcome(args, FAILED, {}, {}, "vLLM exited with status 1")
        metrics = {"ttft_p95_s": value * SLO_S, "error_rate": 0.0}
        scored = score(metrics, Criteria({"ttft_p95_s": SLO_S}, {"ttft_p95_s": 1.0}))
        if (again and seqs in self.behind) or at in self.behind_at:
            metrics[CLIENT_BEHIND] = 1.0
            scored = Score(scored.value, {**scored.constraints, CLIENT_BEHIND: 1.0})
        return TrialOutcome(args, scored, metrics, {})


def run_scripted(
    tmp_path: Path,
    model: Path,
    scripted: Scripted,
    top_k: int,
    repeats: int,
    candidates: bool = False,
    spec_candidates: list[dict[str, Any]] | None = None,
    trials: int = 3,
    **overrides: Any,
):
    raw = spec_dict(model, confirm_candidates=candidates, **overrides)
    if spec_candidates is not None:
        raw["candidates"] = spec_candidates
    spec = parse_spec(raw)
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    setup = TrialSetup(
        model=spec.model,
        requests=(),
        replay=ReplaySettings(model="m", vocab_size=100),
        criteria=Criteria(spec.slos, spec.weights),
    )
    study = open_study("s", storage, 0)
    run_study(study, spec, setup, tmp_path / "runs", trials, runner=scripted, measured_on={})
    how = Measuring(setup, tmp_path / "runs", runner=scripted)
    ran = confirm(study, how, repeats) if top_k else 0
    if candidates:
        # As ``Run.confirm`` does after the round: each candidate other than the finalist.
        state = current(study, repeats)
        final = state.finalist.number if state is not None else None
        for group in ranked(study)[2]:
            if group.number != final:
                ran += again(study, group.number, how, 1 + repeats)
    trace = tmp_path / "trace.csv"
    write_small_trace(trace)
    args = [
        "run", "--trace", str(trace), "--study", "s", "--spec",
        str(write_spec(tmp_path / "spec.yaml", raw)), "--storage", storage, "--n-trials", "0",
        "--configs", str(tmp_path / "configs"),
    ]  # fmt: skip
    return study, ran, args


def header_of(tmp_path: Path) -> str:
    return (tmp_path / "configs" / "s.yaml").read_text()


def test_the_finalist_and_the_baseline_are_measured_fresh_in_abba_order(tmp_path, cpu_model):
    # Trial 1 (max-num-seqs 4) is the finalist, the best searched configuration by its search
    # measurement; it and the baseline are measured three more times each, finalist, baseline,
    # baseline, finalist, finalist, baseline. Trial 2 (8), second in the search, is not.
    scripted = Scripted({None: [0.97, 0.99, 0.96, 1.0], 4: [0.5, 0.9, 0.95, 0.92], 8: [0.6]})
    study, ran, _ = run_scripted(tmp_path, cpu_model, scripted, top_k=1, repeats=3)
    assert scripted.order == [None, 4, 8, 4, None, None, 4, 4, None]
    assert ran == 6
    trials = study.get_trials()
    assert [t.user_attrs.get(CONFIRMS_ATTR) for t in trials] == [None] * 3 + [1, 0, 0, 1, 1, 0]
    assert [t.user_attrs.get(FRESH_ATTR) for t in trials] == [None] * 3 + [1] * 6
    assert all(t.params == trials[t.user_attrs.get(CONFIRMS_ATTR, t.number)].params for t in trials)
    state = current(study, 3)
    assert state is not None and state.finalist.number == 1 and state.baseline.number == 0
    assert [t.number for t in state.finalist_fresh.trials] == [3, 6, 7]
    assert [t.number for t in state.baseline_fresh.trials] == [4, 5, 8]
    assert state.complete and state.against is None and state.next_arm() is None
    # Decided: run again, it measures nothing more.
    how = Measuring(
        TrialSetup(
            model="m", requests=(), replay=ReplaySettings(model="m", vocab_size=100),
            criteria=Criteria({"ttft_p95_s": SLO_S}, {"ttft_p95_s": 1.0}),
        ),
        tmp_path, runner=scripted,
    )  # fmt: skip
    assert confirm(study, how, 3) == 0 and len(study.trials) == 9


def test_a_lucky_search_measurement_does_not_count_in_the_verdict(tmp_path, cpu_model, capsys):
    # Trial 1's search measurement (0.5, lucky once) makes it the finalist, but only fresh
    # measurements count: its first fresh one (0.9) is not better than the baseline's (0.85),
    # and that first pair stops the round after two measurements.
    scripted = Scripted({None: [1.0, 0.85], 4: [0.5, 0.9], 8: [0.6]})
    study, ran, args = run_scripted(tmp_path, cpu_model, scripted, top_k=1, repeats=3)
    assert scripted.order == [None, 4, 8, 4, None] and ran == 2
    state = current(study, 3)
    assert state is not None and state.against is not None
    assert [t.number for t in state.against] == [3, 4] and state.next_arm() is None
    result = choose(study)
    assert result is not None and result.outcome == DEFAULTS and result.group.number == 0
    assert result.closest is not None and result.closest.number == 1
    assert [t.number for t in result.closest.trials] == [3]  # its fresh measurement only
    why = (
        "the finalist, trial 1 (50% better by the median in the search) did not beat them on "
        "fresh engines: its trial 3 (0.900) against their trial 4 (0.850) favours the defaults"
    )
    assert result.why == why
    assert main(args) == EXIT_DEFAULTS_KEPT
    header = header_of(tmp_path)
    assert f"# vLLM's defaults kept: {why}" in header
    assert "max-num-seqs" not in header.split("# Serve with")[1]  # vLLM's defaults, as measured
    assert "# closest searched trial 1: score 0.9, measured once" in header
    assert "vLLM's defaults kept (trial" in capsys.readouterr().out


def test_a_baseline_of_the_spec_is_named_as_such_not_as_vllms_defaults(tmp_path, cpu_model, capsys):
    # The spec's baseline (max-num-seqs 2: the configuration a team runs today) is trial 0; the
    # finalist loses its first fresh pair. Every line says "your configuration" or "the
    # baseline", none "vLLM's defaults", and the file written is the baseline's.
    scripted = Scripted({2: [1.0, 0.85], 4: [0.5, 0.9], 8: [0.6]})
    study, ran, args = run_scripted(
        tmp_path, cpu_model, scripted, top_k=1, repeats=3, baseline={"max-num-seqs": 2}
    )
    assert scripted.order == [2, 4, 8, 4, 2] and ran == 2
    result = choose(study)
    assert result is not None and result.outcome == DEFAULTS and result.group.number == 0
    assert result.why.endswith("against their trial 4 (0.850) favours the baseline")
    assert main(args) == EXIT_DEFAULTS_KEPT
    header = header_of(tmp_path)
    assert f"# your configuration kept: {result.why}" in header
    assert "# baseline trial 0: score" in header and "vLLM's defaults" not in header
    assert "max-num-seqs: 2" in header.split("# Serve with")[1]
    assert "your configuration kept (trial 0); wrote it to" in capsys.readouterr().out


def test_the_finalist_is_fixed_by_the_search_and_a_pair_against_it_ends_the_round(
    tmp_path, cpu_model
):
    # Trial 2 (0.5) is the finalist; its fresh measurement (0.9) loses to the baseline's (0.7),
    # and the round ends there. With it, trial 2's median (0.7) falls behind trial 1's (0.6),
    # but fresh measurements never rank the finalist: trial 1 is not measured in its place,
    # then or when the confirmation runs again.
    scripted = Scripted({None: [0.8, 0.7], 4: [0.6], 8: [0.5, 0.9]})
    study, ran, _ = run_scripted(tmp_path, cpu_model, scripted, top_k=1, repeats=3)
    assert scripted.order == [None, 4, 8, 8, None] and ran == 2
    assert [g.number for g in ranked(study)[0]] == [1, 2, 0]
    state = current(study, 3)
    assert state is not None and state.finalist.number == 2 and state.next_arm() is None
    how = Measuring(
        TrialSetup(
            model="m", requests=(), replay=ReplaySettings(model="m", vocab_size=100),
            criteria=Criteria({"ttft_p95_s": SLO_S}, {"ttft_p95_s": 1.0}),
        ),
        tmp_path, runner=scripted,
    )  # fmt: skip
    assert confirm(study, how, 3) == 0 and len(scripted.order) == 5
    result = choose(study)
    assert result is not None and result.outcome == DEFAULTS
    assert result.closest is not None and result.closest.number == 2
    assert "the finalist, trial 2 (38% better by the median in the search)" in result.why
    assert "its trial 3 (0.900) against their trial 4 (0.700) favours the defaults" in result.why


def test_a_confirmed_winner_s_header_gives_the_gain_with_its_interval(tmp_path, cpu_model, capsys):
    # Fresh: the finalist 0.275, 0.25, 0.3 against the baseline 0.55, 0.5, 0.6. By the median
    # 0.275 against 0.55: 50% better, 2x; at three against three the 90% interval runs from the
    # least ratio of a fresh pair (0.5 / 0.3 = 1.67) to the greatest (0.6 / 0.25 = 2.4).
    scripted = Scripted({None: [0.45, 0.55, 0.5, 0.6], 4: [0.2, 0.275, 0.25, 0.3], 8: [0.8]})
    study, ran, args = run_scripted(tmp_path, cpu_model, scripted, top_k=1, repeats=3)
    assert ran == 6
    result = choose(study)
    assert result is not None and result.outcome == TUNED and result.group.number == 1
    # What is written is the finalist's fresh measurements against the baseline's: the search's
    # (0.2 and 0.45) are in neither.
    assert [t.number for t in result.group.trials] == [3, 6, 7]
    assert result.baseline is not None
    assert [t.number for t in result.baseline.trials] == [4, 5, 8]
    assert result.trial.number == 3  # 0.275, the median fresh measurement
    assert main(args) == 0
    header = header_of(tmp_path)
    assert "# Study 's', trial 3." in header and "max-num-seqs: 4" in header
    assert "# winner trial 1: score median 0.275 of 3 (0.25 to 0.3; trials 3, 6, 7)" in header
    assert "#   it sets max-num-seqs=4" in header
    assert "# defaults trial 0: score median 0.55 of 3 (0.5 to 0.6; trials 4, 5, 8)" in header
    assert (
        "# beats vLLM's defaults on fresh engines: 50% better by the median (2.00x, 90% interval "
        "1.67 to 2.40x; 3 fresh engines each, every pair in its favour, p = 0.05)"
    ) in header
    assert "winner trial 1" in capsys.readouterr().out


def test_a_round_short_of_three_fresh_each_keeps_the_defaults(tmp_path, cpu_model, capsys):
    # confirm_repeats 2: the finalist is better in both fresh pairs, but two against two is
    # 1 in 6 by chance, no verdict; the defaults are kept, and the why says so.
    scripted = Scripted({None: [0.95, 0.98, 1.0], 4: [0.8, 0.85, 0.75], 8: [3.0]})
    study, ran, args = run_scripted(tmp_path, cpu_model, scripted, top_k=1, repeats=2)
    assert scripted.order == [None, 4, 8, 4, None, None, 4] and ran == 4
    state = current(study, 2)
    assert state is not None and state.complete and state.against is None
    assert not state.confirmed
    result = choose(study)
    assert result is not None and result.outcome == DEFAULTS and result.group.number == 0
    assert result.closest is not None and result.closest.number == 1
    why = (
        "the finalist, trial 1 (16% better by the median in the search) was measured 2 times on "
        "fresh engines and the defaults 2 times, short of the 3 each a verdict needs (the time "
        "budget or confirm_repeats ended the confirmation): no verdict from fewer"
    )
    assert result.why == why
    assert main(args) == EXIT_DEFAULTS_KEPT
    header = header_of(tmp_path)
    assert f"# vLLM's defaults kept: {why}" in header
    assert "# closest searched trial 1: score median 0.8 of 2 (0.75 to 0.85; trials 3, 6)" in header
    assert "#   it sets max-num-seqs=4" in header
    assert "max-num-seqs" not in header.split("# Serve with")[1]
    assert "vLLM's defaults kept (trial" in capsys.readouterr().out


def test_one_fresh_pair_against_the_finalist_keeps_the_defaults(tmp_path, cpu_model):
    # Better by the median (0.85 against 0.96) and in 8 of the 9 fresh pairs, but its third
    # fresh measurement (trial 7, 0.95) is worse than the baseline's third (trial 8, 0.9): the
    # rule asks every pair, and the round stops there, complete.
    scripted = Scripted({None: [0.99, 0.97, 0.96, 0.9], 4: [0.8, 0.85, 0.75, 0.95], 8: [3.0]})
    study, ran, args = run_scripted(tmp_path, cpu_model, scripted, top_k=1, repeats=3)
    assert scripted.order == [None, 4, 8, 4, None, None, 4, 4, None] and ran == 6
    state = current(study, 3)
    assert state is not None and state.against is not None
    assert [t.number for t in state.against] == [7, 8]
    assert state.finalist_fresh.gain_over(state.baseline_fresh) > 0.1
    result = choose(study)
    assert result is not None and result.outcome == DEFAULTS
    assert result.why.endswith(
        "its trial 7 (0.950) against their trial 8 (0.900) favours the defaults"
    )
    assert main(args) == EXIT_DEFAULTS_KEPT


def test_the_baseline_winning_says_so_and_an_earlier_confirmation_is_kept(tmp_path, cpu_model):
    scripted = Scripted({None: [0.5, 0.55], 4: [0.6, 0.9], 8: [0.95]})
    study, ran, _ = run_scripted(tmp_path, cpu_model, scripted, top_k=1, repeats=3)
    # The baseline leads the search; the finalist is still the best searched configuration, and
    # its first fresh pair against the baseline ends the round.
    assert scripted.order == [None, 4, 8, 4, None] and ran == 2
    result = choose(study)
    assert result is not None and result.outcome == DEFAULTS and result.group.number == 0
    assert result.closest is not None and result.closest.number == 1
    assert result.why.startswith(
        "the finalist, trial 1 (20% worse by the median in the search) did not beat them"
    ), result.why
    # Run again: the round is decided, nothing is measured.
    setup = TrialSetup(
        model="m", requests=(), replay=ReplaySettings(model="m", vocab_size=100),
        criteria=Criteria({"ttft_p95_s": SLO_S}, {"ttft_p95_s": 1.0}),
    )  # fmt: skip
    assert confirm(study, Measuring(setup, tmp_path, runner=scripted), 3) == 0
    assert len(study.trials) == 5


def test_where_the_defaults_miss_a_finalist_that_fails_a_fresh_pair_misses_too(tmp_path, cpu_model):
    # vLLM's defaults miss the SLO (a score above 1) in every measurement. The finalist meets
    # it in the search and in two fresh measurements, then misses it (trial 7): a miss against
    # a miss favours neither, so the round stops there, and neither is written as meeting them.
    scripted = Scripted({None: [1.5, 1.4, 1.45], 4: [0.8, 0.9, 0.7, 1.6], 8: [3.0]})
    study, ran, args = run_scripted(tmp_path, cpu_model, scripted, top_k=1, repeats=3)
    assert scripted.order == [None, 4, 8, 4, None, None, 4, 4] and ran == 5
    state = current(study, 3)
    assert state is not None and [t.number for t in state.against or ()] == [7, 4]
    result = choose(study)
    assert result is not None and result.outcome == MISSES and result.group.number == 1
    assert result.why == (
        "vLLM's defaults miss the SLOs, and the finalist, trial 1, did not beat them on fresh "
        "engines (it missed them in 1 of 3)"
    )
    assert main(args) == EXIT_MISSES_SLOS


def test_where_the_defaults_miss_a_finalist_that_meets_them_but_loses_a_pair_is_not_confirmed(
    tmp_path, cpu_model, capsys
):
    # vLLM's defaults miss the SLO in the search and two fresh measurements, then meet it better
    # than the finalist's first fresh one: that pair favours them, the round stops, and
    # the finalist, which met the SLO on each fresh engine, is written unconfirmed (exit 3), not
    # said to have missed it.
    scripted = Scripted({None: [1.5, 1.4, 1.3, 0.6], 4: [0.8, 0.7, 0.9, 0.75], 8: [3.0]})
    study, ran, args = run_scripted(tmp_path, cpu_model, scripted, top_k=1, repeats=3)
    assert scripted.order == [None, 4, 8, 4, None, None, 4, 4, None] and ran == 6
    result = choose(study)
    assert result is not None and result.outcome == MISSES and result.group.number == 1
    assert result.why == (
        "vLLM's defaults miss the SLOs, and the finalist, trial 1, did not beat them on fresh "
        "engines (it met them on each of its 3 but was not better in every pair)"
    )
    capsys.readouterr()
    assert main(args) == EXIT_MISSES_SLOS
    out = capsys.readouterr().out
    assert f"not confirmed: {result.why}; wrote it, trial " in out
    assert "no trial met the SLOs" not in out


def test_nothing_is_measured_again_where_no_configuration_met_the_slos(tmp_path, cpu_model):
    # A winner is held against the baseline; with none, re-measuring the baseline (on a slow
    # machine, minutes of an engine that misses every SLO) would change no answer.
    scripted = Scripted({None: [1.5], 4: [1.2], 8: [3.0]})
    study, ran, _ = run_scripted(tmp_path, cpu_model, scripted, top_k=1, repeats=3)
    assert ran == 0 and scripted.order == [None, 4, 8] and len(study.trials) == 3
    result = choose(study)
    assert result is not None and result.outcome == MISSES and result.group.number == 1


def test_capacity_groups_take_the_highest_median(tmp_path):
    study = optuna.create_study(direction="maximize")
    for value, origin in [(2.0, None), (3.0, None), (1.5, 1), (1.4, 1)]:
        attrs = {"feasible": True, "capacity_req_per_s": value, "capacity_points": [{}]}
        if origin is not None:
            attrs[CONFIRMS_ATTR] = origin
        study.add_trial(
            optuna.trial.create_trial(value=value, user_attrs=attrs, params={}, distributions={})
        )
    found = {g.number: g for g in groups(study)}
    assert found[1].median == pytest.approx(1.5) and found[1].worst == 1.4
    assert [g.number for g in ranked(study)[0]] == [0, 1]  # 2.0 once ranks above a median of 1.5
    # With no baseline to hold them against, a configuration measured three times is chosen
    # over one measured once, however lucky: like against like; and written unconfirmed (exit
    # 3), since no test stands behind it.
    result = choose(study)
    assert result is not None and result.outcome == UNCONFIRMED and result.group.number == 1


def test_a_re_measurement_whose_client_fell_behind_is_not_in_the_median():
    study = optuna.create_study(direction="maximize")
    for value, origin, behind in [(2.0, None, False), (1.0, 0, True), (2.2, 0, False)]:
        attrs: dict[str, Any] = {"feasible": not behind, "capacity_req_per_s": value}
        attrs |= {"capacity_points": [{}]} | ({CONFIRMS_ATTR: origin} if origin is not None else {})
        if behind:
            attrs["client_behind"] = 1.0
        study.add_trial(
            optuna.trial.create_trial(value=value, user_attrs=attrs, params={}, distributions={})
        )
    (group,) = groups(study)
    assert [t.number for t in group.trials] == [0, 2] and group.median == pytest.approx(2.1)


def test_fresh_measurements_whose_client_fell_behind_are_taken_again(tmp_path, cpu_model):
    # The baseline's first fresh measurement (trial 4) is flagged: it says nothing of the
    # server, so the baseline is measured again in its place, and the round goes on in ABBA
    # order of the measurements kept (finalist 3, baseline 5, 6, finalist 7, 8, baseline 9).
    scores = {None: [1.0, 1.1, 1.2, 1.15, 1.1], 4: [0.5, 0.6, 0.55, 0.58], 8: [0.7]}
    scripted = Scripted(scores, behind_at=[4])
    study, ran, _ = run_scripted(tmp_path, cpu_model, scripted, top_k=1, repeats=3)
    assert scripted.order == [None, 4, 8, 4, None, None, None, 4, 4, None] and ran == 7
    state = current(study, 3)
    assert state is not None and state.taken == 7 and state.next_arm() is None
    baseline = next(g for g in groups(study) if g.number == 0)
    assert [t.number for t in baseline.left_out] == [4]
    result = choose(study)
    assert result is not None and result.outcome == TUNED and result.group.number == 1
    assert [t.number for t in result.group.trials] == [3, 7, 8]
    assert result.baseline is not None
    assert [t.number for t in result.baseline.trials] == [5, 6, 9]


def test_a_finalist_whose_fresh_engine_fails_is_not_written(tmp_path, cpu_model, capsys):
    # The finalist's first fresh engine did not start: a measurement it lost, not one to take
    # again until the round's limit. The round ends there, and a rerun measures nothing more.
    scores = {None: [1.0, 1.05], 4: [0.5, math.nan, 0.5], 8: [0.7]}
    scripted = Scripted(scores)
    study, ran, args = run_scripted(tmp_path, cpu_model, scripted, top_k=1, repeats=3)
    assert scripted.order == [None, 4, 8, 4] and ran == 1
    state = current(study, 3)
    assert state is not None and state.failed == (3,) and state.next_arm() is None
    assert state.taken == 1 and not state.confirmed
    assert main(args) == EXIT_DEFAULTS_KEPT
    assert "did not serve on a fresh engine (trial 3)" in header_of(tmp_path)
    how = Measuring(TrialSetup("m", (), ReplaySettings("m", 100), Criteria({}, {})), tmp_path)
    assert confirm(study, how, 3) == 0


def test_fresh_measurements_whose_client_fell_behind_count_as_taken(tmp_path, cpu_model):
    # The H100 study of benchmarks/results/h100/: every re-measurement of the baseline was
    # flagged, none entered its median, and the confirmation measured it again until the time ran
    # out. Flagged fresh measurements are left out of the verdict but count as taken: the round
    # stops at its limit (9 for 3 each), and with no fresh measurement of the baseline kept the
    # defaults stay.
    scores = {None: [0.9] + [0.8] * 8, 4: [0.5, 0.5], 8: [0.7]}
    scripted = Scripted(scores, behind=[None])
    study, ran, _ = run_scripted(tmp_path, cpu_model, scripted, top_k=1, repeats=3)
    assert ran == 9 and scripted.order == [None, 4, 8, 4] + [None] * 8
    state = current(study, 3)
    assert state is not None and state.taken == state.limit == 9 and state.next_arm() is None
    result = choose(study)
    assert result is not None and result.outcome == DEFAULTS
    assert "was measured once on fresh engines and the defaults 0 times, short of the 3" in (
        result.why
    )
    baseline = result.baseline
    assert baseline is not None and baseline.values == [0.9] and baseline.measured == 9
    assert [t.user_attrs[CLIENT_BEHIND] for t in baseline.left_out] == [1.0] * 8


def test_the_spec_candidates_are_re_measured_and_held_against_the_winner(
    tmp_path, cpu_model, capsys
):
    # The hand-tuned configuration of a GPU study is a candidate: with confirm_candidates it is
    # measured again after the round (the finalist, 8, a candidate itself, is not), and the
    # verdict holds the winner's fresh measurements against its re-measurements.
    scores = {None: [0.97, 0.99, 0.96, 1.0], 4: [0.9, 0.85, 0.95, 0.92], 8: [0.5, 0.55, 0.52, 0.53]}
    scripted = Scripted(scores)
    study, ran, args = run_scripted(tmp_path, cpu_model, scripted, 1, 3, candidates=True)
    assert scripted.order == [None, 4, 8, 8, None, None, 8, 8, None, 4, 4, 4] and ran == 9
    result = choose(study)
    assert result is not None and result.outcome == TUNED and result.group.number == 2
    assert [g.number for g in result.candidates] == [1, 2]
    assert main(args) == 0
    header = header_of(tmp_path)
    assert "# candidate trial 1: score median 0.92 of 3 (0.85 to 0.95; trials 9, 10, 11)" in header
    assert "# beats candidate trial 1 beyond the measured spread" in header
    assert "candidate trial 2" not in header  # the winner itself
    assert "beats candidate trial 1" in capsys.readouterr().out


def test_a_candidate_inside_the_winner_s_spread_is_called_noise(tmp_path, cpu_model):
    scores = {None: [0.97, 0.99, 0.96, 1.0], 4: [0.6, 0.5, 0.7, 0.55], 8: [0.5, 0.65, 0.52, 0.6]}
    _, _, args = run_scripted(tmp_path, cpu_model, Scripted(scores), 1, 3, candidates=True)
    assert main(args) == 0
    header = header_of(tmp_path)
    assert "# winner trial 2: score median 0.6 of 3" in header
    assert "# within noise of candidate trial 1" in header


def test_candidates_are_held_against_the_defaults_kept(tmp_path, cpu_model):
    # confirm_repeats 2: the finalist (8, candidate 1) is better in both fresh pairs, too few
    # for a verdict, so the defaults are kept; candidate 0 (4), measured three times like them,
    # is slower in every pair.
    scores = {None: [0.5, 0.55, 0.52], 4: [0.9, 0.85, 0.95], 8: [0.45, 0.4, 0.42]}
    scripted = Scripted(scores)
    _, ran, args = run_scripted(tmp_path, cpu_model, scripted, 1, 2, candidates=True)
    assert scripted.order == [None, 4, 8, 8, None, None, 8, 4, 4] and ran == 6
    assert main(args) == EXIT_DEFAULTS_KEPT
    header = header_of(tmp_path)
    assert "# vLLM's defaults kept: the finalist, trial 2 (" in header
    assert "# defaults trial 0: score median 0.52 of 3 (0.5 to 0.55; trials 0, 4, 5)" in header
    assert "# candidate trial 1: score median 0.9 of 3 (0.85 to 0.95; trials 1, 7, 8)" in header
    assert "# beats candidate trial 1 beyond the measured spread" in header


def test_without_the_option_candidates_are_not_re_measured(tmp_path, cpu_model):
    scripted = Scripted({None: [0.97, 0.99, 0.96, 1.0], 4: [0.9], 8: [0.5, 0.55, 0.52, 0.53]})
    _, ran, args = run_scripted(tmp_path, cpu_model, scripted, 1, 3)
    assert scripted.order == [None, 4, 8, 8, None, None, 8, 8, None] and ran == 6
    assert main(args) == 0
    assert "candidate trial" not in header_of(tmp_path)


@pytest.mark.vllm
def test_confirm_only_finishes_a_confirmation_and_adds_no_trial(tmp_path, cpu_model, stand_in_vllm):
    """A run cut short before its confirmation (a machine's time running out) is finished by
    ``tuner run --confirm-only`` on the same study: the finalist and the baseline measured on
    fresh engines, no searched trial added; run again, it has nothing left to do."""
    spec = cpu_spec(cpu_model, window_s=2, time_scale=1, n_trials=2)
    write_spec(tmp_path / "spec.yaml", spec)
    trace = write_small_trace(tmp_path / "trace.csv")
    storage = f"sqlite:///{tmp_path / 's.db'}"
    args = ["run", "--trace", trace, "--study", "s", "--spec", tmp_path / "spec.yaml"]
    args += ["--storage", storage]
    done = run_tuner(*args, cwd=tmp_path, env=stand_in_vllm, timeout_s=180)
    assert done.returncode in MEETS_SLOS_EXITS, done.stdout + done.stderr
    assert "confirming" not in done.stdout  # confirm_top_k 0: as if cut short
    write_spec(tmp_path / "spec.yaml", spec | {"confirm_top_k": 1, "confirm_repeats": 1})
    done = run_tuner(*args, "--confirm-only", cwd=tmp_path, env=stand_in_vllm, timeout_s=180)
    assert done.returncode in MEETS_SLOS_EXITS, done.stdout + done.stderr
    assert "adding 0" in done.stdout
    assert "confirming the finalist, trial 1, against your configuration" in done.stdout
    trials = optuna.load_study(study_name="s", storage=storage).trials
    repeats = sorted(t.user_attrs[CONFIRMS_ATTR] for t in trials if CONFIRMS_ATTR in t.user_attrs)
    # One fresh measurement each: the finalist's, then the baseline's.
    assert len(trials) == 2 + len(repeats) and repeats == [0, 1], repeats
    assert all(t.user_attrs.get(FRESH_ATTR) == 1 for t in trials if CONFIRMS_ATTR in t.user_attrs)
    done = run_tuner(*args, "--confirm-only", cwd=tmp_path, env=stand_in_vllm, timeout_s=180)
    assert done.returncode in MEETS_SLOS_EXITS, done.stdout + done.stderr
    assert len(optuna.load_study(study_name="s", storage=storage).trials) == len(trials)
    assert "not confirming again: the confirmation of trial 1 is done" in done.stdout


# --- tuner run and tuner report name the same trial -------------------------------------------

WRITTEN_BY = re.compile(r"^# Study 's', trial (\d+)\.$", re.MULTILINE)


def written_and_reported(tmp_path: Path, args: list[str]) -> tuple[int, str]:
    """``tuner run --n-trials 0`` (``args``, from ``run_scripted``) writes the YAML, then
    ``tuner report`` the page: the trial the YAML's header names, and the page."""
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    main(args)
    found = WRITTEN_BY.search((tmp_path / "configs" / "s.yaml").read_text())
    assert found is not None
    out = tmp_path / "report"
    configs = str(tmp_path / "configs")
    assert main(["report", "s", "--storage", storage, "--configs", configs, "--out", str(out)]) == 0
    return int(found[1]), (out / "index.html").read_text()


def chosen_rows(page: str) -> list[str]:
    return re.findall(r'<tr class="chosen"><td>(\d+)</td>', page)


def verdict_columns(page: str) -> list[str]:
    return re.findall(r"<th>(trial \d+: [^<]*)</th>", page)


def test_report_names_the_trial_run_wrote_after_a_confirm_step(tmp_path, cpu_model, capsys):
    # Trial 1 has the lowest single score (0.5, lucky once in the search) and is the finalist;
    # what is written is its median fresh measurement (trial 7, 0.92): tuner run writes trial 7,
    # and the report, which took the lowest single score before, names it too.
    scripted = Scripted({None: [0.97, 0.99, 0.96, 1.0], 4: [0.5, 0.9, 0.95, 0.92], 8: [0.6]})
    study, _, args = run_scripted(tmp_path, cpu_model, scripted, top_k=1, repeats=3)
    assert picks.best_trial(study).number == 1  # what the report chose before
    written, page = written_and_reported(tmp_path, args)
    assert written == 7
    assert chosen_rows(page) == ["7"]
    # Trial 1 is the same configuration's search measurement, shown as the candidate it is.
    assert verdict_columns(page) == [
        "trial 7: best",
        "trial 0: vLLM&#x27;s defaults",
        "trial 1: candidate 0",
        "trial 2: candidate 1",
    ]
    said = (
        "Trial 7 meets every SLO (the median of its 3 measurements: trials 3, 6 and 7), with "
        "the best median score of 3 feasible configurations."
    )
    assert said in page
    assert "<li>winner trial 1: score median 0.92 of 3 (0.9 to 0.95; trials 3, 6, 7)</li>" in page
    assert "<li>beats vLLM&#x27;s defaults on fresh engines: 7% better by the median" in page
    assert "<code>tuner run</code> wrote trial 7 to " in page
    assert "is not from this trial" not in page


def test_the_closest_is_the_best_median_too(tmp_path, cpu_model, capsys):
    # Trial 1 met the SLO once (a score above 1 misses it) and is re-measured with the baseline;
    # its second measurement misses, so no configuration meets the SLO and the confirmation
    # stops. The baseline's re-measurement was lucky (trial 4, 1.1, the lowest score of a miss),
    # but its median is 1.3; trial 2's 1.2 is the best median, the closest, in the YAML and on
    # the page.
    scripted = Scripted({None: [1.5, 1.1], 4: [0.95, 1.6], 8: [1.2]})
    study, ran, args = run_scripted(tmp_path, cpu_model, scripted, top_k=1, repeats=2)
    assert ran == 2 and scripted.order == [None, 4, 8, 4, None]
    misses = [t for t in study.trials if t.value > 1]
    assert min(misses, key=lambda t: t.value).number == 4  # the old choice
    written, page = written_and_reported(tmp_path, args)
    assert written == 2
    assert chosen_rows(page) == ["2"]
    assert "No trial met the SLOs. The closest, trial 2: " in page
    assert "<code>tuner run</code> wrote trial 2 to " in page


def test_a_re_measurement_of_the_baseline_chosen_is_the_baseline(tmp_path, cpu_model):
    # The baseline's median measurement is its fresh one (trial 4, the worse middle of two):
    # the page calls it vLLM's defaults, in one column, and does not show trial 0 beside it as
    # another configuration. The finalist (trial 2) is the closest searched, by its first trial.
    scripted = Scripted({None: [0.45, 0.5], 4: [0.9], 8: [0.7, 0.75]})
    _, _, args = run_scripted(tmp_path, cpu_model, scripted, top_k=1, repeats=3)
    assert scripted.order == [None, 4, 8, 8, None]
    written, page = written_and_reported(tmp_path, args)
    assert written == 4 and chosen_rows(page) == ["4"]
    assert verdict_columns(page) == [
        "trial 4: best, vLLM&#x27;s defaults",
        "trial 2: closest searched, candidate 1",
        "trial 1: candidate 0",
    ]
    kept = (
        "It is vLLM's own defaults, kept: the finalist, trial 2 (56% worse by the median in the "
        "search) did not beat them on fresh engines: its trial 3 (0.750) against their trial 4 "
        "(0.500) favours the defaults."
    )
    assert kept in page


def test_the_closest_skips_a_configuration_whose_client_fell_behind():
    study = optuna.create_study()
    for value, behind in [(3.0, False), (2.0, True), (2.5, False)]:
        attrs: dict[str, Any] = {"feasible": False} | ({CLIENT_BEHIND: 1.0} if behind else {})
        study.add_trial(
            optuna.trial.create_trial(value=value, user_attrs=attrs, params={}, distributions={})
        )
    choice = choose(study)
    assert choice is not None and not choice.meets_slos and choice.trial.number == 2
    assert choose(optuna.create_study()) is None


@pytest.mark.parametrize(
    ("folder", "name", "trial"), [("h200-story-cap", "story", 0), ("h100-story", "story", 4)]
)
def test_the_committed_gpu_studies_report_the_trial_tuner_wrote(tmp_path, folder, name, trial):
    # h200-story-cap: trial 14 (a re-measurement of the defaults, 120 req/s) is the highest
    # single capacity; tuner wrote trial 0, the defaults' median (104). h100-story: trial 12 is
    # the lowest single score; tuner wrote trial 4.
    results = REPO / "tests" / "data" / folder
    shutil.copy(results / "study.db", tmp_path / "study.db")
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    header = WRITTEN_BY.pattern.replace("'s'", f"'{name}'")
    found = re.search(header, (results / "configs" / f"{name}.yaml").read_text(), re.MULTILINE)
    assert found is not None and int(found[1]) == trial
    report = read_report(name, storage, results / "configs")
    assert report.chosen == trial and report.meets_slos
    assert report.configuration is not None and report.configuration.trial == trial
    page = write_report(name, storage, tmp_path / "out", results / "configs").read_text()
    assert chosen_rows(page) == [str(trial)]
    assert f"<code>tuner run</code> wrote trial {trial} to " in page


# --- what the configuration written sets ----------------------------------------------------


def test_what_the_winner_sets_names_vllms_own_values_apart(tmp_path):
    """The H200 code study (benchmarks/results/h200-code-mooncake-users/code): its winner moved
    one engine argument from vLLM's value and wrote four more at vLLM's own values."""
    db = tmp_path / "prod.db"
    shutil.copy(REPO / "benchmarks/results/h200-code-mooncake-users/code/prod.db", db)
    report = read_report("prod", f"sqlite:///{db}", tmp_path)
    sets = (
        "  it sets max-num-batched-tokens=2048 (vLLM's 8192); as vLLM sets them: "
        "api-server-count=1 compilation-config.max_cudagraph_capture_size=512 max-num-seqs=1024 "
        "gpu-memory-utilization=0.9"
    )
    assert sets in report.confirmation, report.confirmation


def _args_study(searched: dict[str, Any], baseline: dict[str, Any] | None = None) -> optuna.Study:
    study = optuna.create_study(direction="minimize")
    for args, is_baseline in [(baseline or {}, True), (searched, False)]:
        attrs = {"feasible": True, "engine_args": args, "baseline": is_baseline or None}
        study.add_trial(
            optuna.trial.create_trial(value=1.0, user_attrs=attrs, params={}, distributions={})
        )
    return study


def test_what_a_configuration_sets_against_vllms_values():
    vllm = {"max-num-seqs": 1024, "max-num-batched-tokens": 8192}
    found = {g.number: g for g in groups(_args_study({"max-num-seqs": 1024, "block-size": 32}))}
    assert changed(found[1], found[0]) == "max-num-seqs=1024 block-size=32"
    assert changed(found[1], found[0], vllm) == (
        "block-size=32; as vLLM sets them: max-num-seqs=1024"
    )
    found = {g.number: g for g in groups(_args_study({"max-num-batched-tokens": 8192}))}
    assert changed(found[1], found[0], vllm) == (
        "only what vLLM sets itself: max-num-batched-tokens=8192"
    )
    assert changed(found[0], found[0], vllm) == "(the same arguments)"
    # A baseline of the spec's own against vLLM's defaults: what it sets and they leave to vLLM,
    # one clause, the names apart from the arguments set.
    mine = {"max-num-seqs": 2, "max-num-batched-tokens": 512}
    found = {g.number: g for g in groups(_args_study({}, baseline=mine))}
    assert changed(found[1], found[0], vllm) == (
        "left to vLLM: max-num-seqs (the baseline's 2), max-num-batched-tokens (the baseline's 512)"
    )
    found = {g.number: g for g in groups(_args_study({"block-size": 32}, baseline=mine))}
    assert changed(found[1], found[0]) == (
        "block-size=32; left to vLLM: max-num-seqs (the baseline's 2), "
        "max-num-batched-tokens (the baseline's 512)"
    )
