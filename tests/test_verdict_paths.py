"""Every path that writes a searched configuration with exit 0 has a test behind it.

A searched configuration is written with exit 0 only where its round confirmed it on fresh
engines; otherwise, where it meets the SLOs and the baseline did not, it is written unconfirmed
(exit 3). The paths: a baseline that missed the SLOs with no fresh measurement of it, a
finalist whose own fresh engine failed, a baseline whose engine failed at the start (started
once more), a study continued after its round (one round a study), and candidates re-measured
after the round (the finalist frozen when its round starts).

Studies are real Optuna studies filled through ``run_study`` and ``confirm`` with
``test_confirm``'s scripted runner (scores per configuration and measurement; NaN: an engine
that did not start); ``tuner run --n-trials 0`` then writes the configuration and exits as
after a real run.
"""

from __future__ import annotations

import math
from pathlib import Path

from optuna.trial import TrialState
from test_confirm import SLO_S, Scripted, header_of, run_scripted, spec_dict

from tuner.cli.exits import EXIT_DEFAULTS_KEPT, EXIT_MEETS_SLOS, EXIT_MISSES_SLOS
from tuner.cli.main import main
from tuner.load.http import ReplaySettings
from tuner.report.build import read_report
from tuner.report.page import render
from tuner.study.measure.trial import Criteria, TrialSetup
from tuner.study.plan.spec import parse_spec
from tuner.study.result.choice import DEFAULTS, MISSES, TUNED, UNCONFIRMED, choose
from tuner.study.store.record import TrialRecord
from tuner.study.trials import references
from tuner.study.trials.confirm import confirm, current
from tuner.study.trials.search import Measuring, run_study


def measuring(tmp_path: Path, scripted: Scripted) -> Measuring:
    setup = TrialSetup(
        model="m", requests=(), replay=ReplaySettings(model="m", vocab_size=100),
        criteria=Criteria({"ttft_p95_s": SLO_S}, {"ttft_p95_s": 1.0}),
    )  # fmt: skip
    return Measuring(setup, tmp_path / "runs", runner=scripted)


def test_a_baseline_that_missed_with_no_fresh_measurement_writes_unconfirmed_exit_3(
    tmp_path, cpu_model, capsys
):
    # vLLM's defaults miss the SLO in the search (1.5); trial 1 meets it (0.8); the spec turns
    # the confirmation off. Nothing tested trial 1 against the defaults: exit 3, not 0.
    scripted = Scripted({None: [1.5], 4: [0.8], 8: [3.0]})
    study, ran, args = run_scripted(
        tmp_path, cpu_model, scripted, top_k=0, repeats=3, confirm_repeats=0
    )
    assert ran == 0 and scripted.order == [None, 4, 8]
    result = choose(study)
    assert result is not None and result.outcome == UNCONFIRMED and result.group.number == 1
    assert result.why == (
        "meets the SLOs where vLLM's defaults miss them, in the search's measurements: not "
        "confirmed on fresh engines (vLLM's defaults not measured again)"
    )
    capsys.readouterr()
    assert main(args) == EXIT_MISSES_SLOS
    out = capsys.readouterr().out
    assert f"not confirmed: {result.why}; wrote it, trial 1," in out
    assert "# unconfirmed trial 1: score 0.8, measured once" in header_of(tmp_path)
    # tuner report says the same: unconfirmed, and why, in its verdict and its lines.
    report = read_report("s", f"sqlite:///{tmp_path / 'study.db'}", tmp_path / "configs")
    assert report.chosen == 1 and report.unconfirmed_because == result.why
    page = render(report, {})
    verdict = page[page.index('<section id="verdict">') :]
    assert "Unconfirmed: it meets the SLOs where vLLM&#x27;s defaults miss them" in verdict
    assert "unconfirmed trial 1: score 0.8, measured once" in verdict


def test_a_finalist_whose_own_fresh_engine_failed_is_not_written_for_it(
    tmp_path, cpu_model, capsys
):
    # vLLM's defaults miss the SLO; the finalist's first fresh engine does not start, which
    # ends its round before the defaults are measured again. Its failure is no reason to write
    # it: it is the closest, exit 3, and the why names the failed trial.
    scripted = Scripted({None: [1.5], 4: [0.8, math.nan], 8: [3.0]})
    study, ran, args = run_scripted(tmp_path, cpu_model, scripted, top_k=1, repeats=3)
    assert ran == 1 and scripted.order == [None, 4, 8, 4]
    state = current(study, 3)
    assert state is not None and state.failed == (3,) and not state.baseline_fresh.trials
    result = choose(study)
    assert result is not None and result.outcome == MISSES and result.group.number == 1
    assert result.why == (
        "vLLM's defaults miss the SLOs, and the finalist, trial 1, did not beat them on fresh "
        "engines (its fresh engine did not serve: trial 3)"
    )
    assert main(args) == EXIT_MISSES_SLOS


def test_a_baseline_whose_engine_failed_is_started_once_more_and_its_verdict_tested(
    tmp_path, cpu_model
):
    # Trial 0, vLLM's defaults, does not start; trial 1 starts them again and serves, and the
    # finalist is confirmed against that one on fresh engines (exit 0 only so).
    scores = {None: [math.nan, 1.0, 1.0, 1.05, 0.98], 4: [0.5, 0.5, 0.55, 0.52], 8: [0.9]}
    scripted = Scripted(scores)
    study, ran, args = run_scripted(tmp_path, cpu_model, scripted, top_k=1, repeats=3, trials=4)
    assert scripted.order[:4] == [None, None, 4, 8] and ran == 6
    assert [TrialRecord.of(t).baseline for t in study.trials[:3]] == [True, True, False]
    result = choose(study)
    assert result is not None and result.outcome == TUNED and result.group.number == 2
    assert result.baseline is not None and result.baseline.first.number == 1
    assert main(args) == EXIT_MEETS_SLOS


def test_a_baseline_that_fails_twice_leaves_a_searched_configuration_unconfirmed(
    tmp_path, cpu_model, capsys
):
    # Both of the defaults' starts fail: the study goes on with the search, nothing is started
    # a third time, and what met the SLOs is written unconfirmed (exit 3), never 0.
    scripted = Scripted({None: [math.nan, math.nan], 4: [0.5], 8: [0.6]})
    study, ran, args = run_scripted(tmp_path, cpu_model, scripted, top_k=1, repeats=3, trials=4)
    assert scripted.order == [None, None, 4, 8] and ran == 0
    result = choose(study)
    assert result is not None and result.outcome == UNCONFIRMED and result.group.number == 2
    assert result.why == (
        "meets the SLOs where vLLM's defaults did not serve (trials 0, 1): not confirmed on "
        "fresh engines, with no baseline to test it against"
    )
    assert main(args) == EXIT_MISSES_SLOS


def test_the_baseline_is_started_at_most_twice_and_a_second_start_is_no_duplicate(
    tmp_path, cpu_model
):
    # A second start of a failed baseline is measured (a duplicate would end FAIL, unmeasured);
    # after two failed starts the baseline counts as taken and is not queued a third time.
    scripted = Scripted({None: [math.nan, math.nan], 4: [0.5], 8: [0.6]})
    study, _, _ = run_scripted(tmp_path, cpu_model, scripted, top_k=0, repeats=3, trials=4)
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 4
    assert [TrialRecord.of(t).baseline for t in study.trials] == [True, True, False, False]
    assert references.baseline_taken(study)
    assert not references.queue_next(study, parse_spec(spec_dict(cpu_model)))


def test_a_continued_study_confirms_no_second_finalist(tmp_path, cpu_model, capsys):
    # The study's round went against trial 1. Continued, the search finds trial 5 (max-num-seqs
    # 16) far ahead; a second round could write it with its own 1 in 20, so none is opened:
    # nothing more is measured, and the defaults stay.
    scripted = Scripted({None: [1.0, 0.9], 4: [0.8, 0.95], 8: [0.85], 16: [0.3] * 8})
    study, ran, args = run_scripted(tmp_path, cpu_model, scripted, top_k=1, repeats=3)
    assert ran == 2 and scripted.order == [None, 4, 8, 4, None]
    more = parse_spec(spec_dict(cpu_model, candidates=[{"max-num-seqs": s} for s in (4, 8, 16)]))
    how = measuring(tmp_path, scripted)
    run_study(study, more, how.setup, tmp_path / "runs", 1, runner=scripted, measured_on={})
    assert scripted.order[-1] == 16
    assert confirm(study, how, 3) == 0
    state = current(study, 3)
    assert state is not None and state.finalist.number == 1
    result = choose(study)
    assert result is not None and result.outcome == DEFAULTS
    assert "the finalist, trial 1 " in result.why
    assert main(args) == EXIT_DEFAULTS_KEPT


def test_candidates_re_measured_after_the_round_leave_its_finalist_confirmed(
    tmp_path, cpu_model, capsys
):
    # As tuner init --current sets it up: the spec's candidates are re-measured after the
    # round. Trial 2 (max-num-seqs 8) is the finalist and beats the defaults in every fresh
    # pair; candidate trial 1 (4) is then measured three more times, better than trial 2 was
    # in the search. The finalist was frozen when its round started: the verdict stands.
    scores = {None: [1.0, 1.0, 1.05, 0.98], 4: [0.6, 0.4, 0.4, 0.4], 8: [0.55, 0.5, 0.5, 0.5]}
    scripted = Scripted(scores)
    study, ran, args = run_scripted(
        tmp_path, cpu_model, scripted, top_k=1, repeats=3, candidates=True
    )
    assert scripted.order == [None, 4, 8, 8, None, None, 8, 8, None, 4, 4, 4] and ran == 9
    state = current(study, 3)
    assert state is not None and state.finalist.number == 2 and state.confirmed
    result = choose(study)
    assert result is not None and result.outcome == TUNED and result.group.number == 2
    assert main(args) == EXIT_MEETS_SLOS
