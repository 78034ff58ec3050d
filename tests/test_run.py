"""A run below the command line: ``Run``'s steps driven as ``tuner run`` and the benchmarks drive
them, each telling what it does.

The study is a real Optuna study in SQLite; the trials are measured by the scripted runner of
``test_confirm.py`` (scores per configuration and measurement, no engine), passed as ``Run``'s
``runner``. What ``tuner run`` prints of the same steps is checked against the
stand-in server in ``test_run_e2e.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import optuna
import pytest
from conftest import write_small_trace
from optuna.trial import FrozenTrial
from test_confirm import Scripted, spec_dict

from tuner.engine.handle import ServerHandle
from tuner.engine.launchers import ProcessLauncher
from tuner.errors import InputError
from tuner.study.measure.scoring import Criteria
from tuner.study.measure.trial import OnProgress
from tuner.study.plan.spec import StudySpec, parse_spec
from tuner.study.result.choice import DEFAULTS, TUNED
from tuner.study.result.run import Run
from tuner.study.result.run_config import resolve
from tuner.study.setup.prepare import Workload, model_of, open_loop_replay
from tuner.study.trials.search import TrialRunner, open_study
from tuner.traces.formats import load_trace


class Heard:
    """A ``Teller`` that keeps what it is told."""

    progress: OnProgress | None = None

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.started: list[int] = []
        self.finished: list[int] = []

    def say(self, line: str) -> None:
        self.lines.append(line)

    def trial_started(self, number: int, engine_args: Mapping[str, Any]) -> None:
        self.started.append(number)

    def engine_started(self, server: ServerHandle) -> None:
        pass

    def trial_finished(self, trial: FrozenTrial) -> None:
        self.finished.append(trial.number)


def workload(tmp_path: Path, spec: StudySpec) -> Workload:
    path = write_small_trace(tmp_path / "trace.csv")
    trace = load_trace(path)
    model = model_of(spec)
    replay = open_loop_replay(trace, spec.window_s, 1.0, model.max_model_len)
    return Workload(path, "0" * 64, trace, replay, spec.window_s, 1.0, model)


def a_run(
    study: optuna.Study,
    spec: StudySpec,
    tmp_path: Path,
    scripted: TrialRunner,
    teller: Heard | None = None,
    **given: Any,
) -> Run:
    """A run of ``spec`` measured by ``scripted``, ``given`` over the spec (``resolve``)."""
    config = resolve(spec, "s", tmp_path / "runs", tmp_path / "configs" / "s.yaml", **given)
    wl = workload(tmp_path, spec)
    return Run(study, spec, wl, config, teller, launcher=ProcessLauncher(), runner=scripted)


CONFIRMING = (
    "confirming the finalist, trial 1, against vLLM's defaults: 3 fresh measurements each, in "
    "turns (finalist, vLLM's defaults, vLLM's defaults, finalist, ...), stopping at the first "
    "pair that favours vLLM's defaults"
)


def test_a_run_adds_trials_confirms_and_writes_the_winner(tmp_path, cpu_model):
    scripted = Scripted({None: [0.9, 0.95, 0.92, 0.97], 4: [0.5, 0.6, 0.55, 0.58], 8: [0.7]})
    # Trial 0 the baseline, trials 1 and 2 the spec's candidates (max-num-seqs 4 and 8).
    spec = parse_spec(spec_dict(cpu_model, n_trials=3, confirm_top_k=1, confirm_repeats=3))
    study = open_study("s", f"sqlite:///{tmp_path / 's.db'}", 0)
    heard = Heard()
    run = a_run(study, spec, tmp_path, scripted, heard)

    assert run.calibrate().time_scale == 1.0  # no time_scale: auto, nothing measured
    assert run.add_trials() == spec.n_trials == 3
    assert run.confirm() == 6  # the finalist and the baseline, three fresh measurements each
    written = run.result()

    assert heard.started == heard.finished == list(range(9))
    assert scripted.order == [None, 4, 8, 4, None, None, 4, 4, None]
    # Without a budget: what the run will take, before the first trial (estimated) and after
    # the first two (measured), then the confirmation.
    told, rest = heard.lines[:3], heard.lines[3:]
    assert told[0].startswith("no time budget: 3 more trials and the confirmation (the finalist")
    assert [line.split(" more")[0] for line in told] == [f"no time budget: {n}" for n in (3, 2, 1)]
    assert "estimated" in told[0] and all("measured" in line for line in told[1:])
    assert rest == [CONFIRMING]
    # Run again (a study continued), it measures nothing and does not say it is confirming.
    assert run.confirm() == 0 and len(scripted.order) == 9
    assert heard.lines[-1] == "not confirming again: the confirmation of trial 1 is done"
    assert written is not None and written.choice.outcome == TUNED
    assert written.trial.number in written.choice.measurements and written.choice.group.number == 1
    assert written.choice.measurements == (3, 6, 7)  # its fresh measurements, not the search's
    text = written.path.read_text()
    assert "# Study 's', trial" in text and "max-num-seqs: 4" in text
    assert any(line.startswith("winner trial 1: score median 0.58 of 3") for line in written.lines)
    assert any(
        line.startswith("beats vLLM's defaults on fresh engines: ") for line in written.lines
    )


def test_every_measurement_is_given_the_specs_criteria_whole(tmp_path, cpu_model):
    """The search's trials and the confirmation's fresh measurements are each handed the spec's
    SLOs, weights and ``max_error_rate`` together, as the run's configuration holds them."""
    scripted = Scripted({None: [0.9, 0.95, 0.92, 0.97], 4: [0.5, 0.6, 0.55, 0.58], 8: [0.7]})
    raw = spec_dict(cpu_model, n_trials=3, confirm_top_k=1, confirm_repeats=3)
    spec = parse_spec({**raw, "max_error_rate": 0.2})
    seen: list[Criteria] = []

    def runner(args: Any, setup: Any, workdir: Path, should_stop: Any = None) -> Any:
        seen.append(setup.criteria)
        return scripted(args, setup, workdir, should_stop)

    run = a_run(open_study("s", f"sqlite:///{tmp_path / 's.db'}", 0), spec, tmp_path, runner)
    assert run.add_trials() == 3 and run.confirm() == 6
    assert len(seen) == 9 and all(criteria == Criteria.of(spec) for criteria in seen)
    assert seen[-1].max_error_rate == 0.2 and run.config.criteria == Criteria.of(spec)


def test_a_finalist_that_is_vllms_defaults_is_announced_so(tmp_path, cpu_model):
    # Your configuration as the baseline, vLLM's defaults (``{}``) a candidate that leads.
    scripted = Scripted({2: [0.9, 0.95, 0.92, 0.93], None: [0.5, 0.5, 0.52, 0.51], 8: [0.8]})
    raw = spec_dict(cpu_model, n_trials=3, confirm_top_k=1, confirm_repeats=3)
    raw |= {"baseline": {"max-num-seqs": 2}, "candidates": [{}, {"max-num-seqs": 8}]}
    spec = parse_spec(raw)
    study = open_study("s", f"sqlite:///{tmp_path / 's.db'}", 0)
    heard = Heard()
    run = a_run(study, spec, tmp_path, scripted, heard)
    run.add_trials()
    assert run.confirm() == 6
    assert any(
        line.startswith("confirming the finalist, trial 1 (vLLM's defaults), against your")
        for line in heard.lines
    ), heard.lines


def test_a_continued_study_holds_back_only_what_its_confirmation_still_needs(tmp_path, cpu_model):
    """A first run's confirmation took one fresh measurement each (confirm_repeats 1); a second
    run asking for three holds back the four its round still needs, not six, and takes them in
    the ABBA order the first began."""
    scripted = Scripted({None: [0.9, 0.95, 0.92, 0.97], 4: [0.5, 0.6, 0.55, 0.58], 8: [0.7]})
    spec = parse_spec(spec_dict(cpu_model, n_trials=3, confirm_top_k=1, confirm_repeats=1))
    study = open_study("s", f"sqlite:///{tmp_path / 's.db'}", 0)
    first = a_run(study, spec, tmp_path, scripted, Heard())
    assert first.add_trials() == 3 and first.confirm() == 2
    spec = parse_spec(spec_dict(cpu_model, n_trials=3, confirm_top_k=1, confirm_repeats=3))
    again = a_run(study, spec, tmp_path, scripted, Heard(), time_budget_s=3600.0)
    assert again.budget is not None and again.budget.confirm_trials == 4
    assert again.confirm() == 4
    assert scripted.order == [None, 4, 8, 4, None, None, 4, 4, None]
    written = again.result()
    assert written is not None and written.choice.outcome == TUNED


def test_a_continued_study_whose_search_moved_on_says_it_confirms_one_finalist(tmp_path, cpu_model):
    """The study's round went against trial 1; a continuation finds trial 5 far ahead in the
    search. It opens no second round (each would add its own chance of writing a configuration
    no better) and says which trial leads and how to confirm it."""
    scores = {None: [1.0, 0.9], 4: [0.8, 0.95], 8: [0.85], 16: [0.3] * 8}
    scripted = Scripted(scores)
    spec = parse_spec(spec_dict(cpu_model, n_trials=3, confirm_top_k=1, confirm_repeats=3))
    study = open_study("s", f"sqlite:///{tmp_path / 's.db'}", 0)
    first = a_run(study, spec, tmp_path, scripted, Heard())
    assert first.add_trials() == 3 and first.confirm() == 2
    candidates = [{"max-num-seqs": n} for n in (4, 8, 16)]
    more = parse_spec(spec_dict(cpu_model, n_trials=1, candidates=candidates))
    heard = Heard()
    again = a_run(study, more, tmp_path, scripted, heard)
    assert again.add_trials() == 1 and scripted.order[-1] == 16
    assert again.confirm() == 0 and len(scripted.order) == 6
    assert heard.lines[-1] == (
        "not confirming again: the confirmation of trial 1 is done; trial 5 leads the search "
        "now, but a study holds one confirmation, so that continuing it never adds another "
        "chance of writing a configuration no better than the baseline: a new study, with it "
        "among its spec's candidates, confirms it"
    )
    written = again.result()
    assert written is not None and written.choice.outcome == DEFAULTS


def test_where_only_the_defaults_served_they_are_measured_again(tmp_path, cpu_model):
    """Nothing searched to hold against them, vLLM's defaults are still the answer written, with
    the capacity a user plans servers by: their median over fresh engines, as a winner's is."""
    scripted = Scripted({None: [1.0, 0.9, 1.2]})
    spec = parse_spec(spec_dict(cpu_model, n_trials=1, confirm_top_k=1, confirm_repeats=2))
    study = open_study("s", f"sqlite:///{tmp_path / 's.db'}", 0)
    heard = Heard()
    run = a_run(study, spec, tmp_path, scripted, heard)
    assert run.add_trials() == 1 and run.confirm() == 2
    assert scripted.order == [None, None, None]
    assert heard.lines[0].startswith("no time budget: 1 more trial and the confirmation")
    assert heard.lines[1:] == [
        "confirming vLLM's defaults, the only configuration that served: measured up to 2 more "
        "times on fresh engines, so that what is written is the median"
    ]
    written = run.result()
    assert written is not None and written.choice.outcome == DEFAULTS
    assert written.choice.group.measured == 3
    assert any(line.startswith("defaults trial 0: score median 1 of 3") for line in written.lines)
    assert run.confirm() == 0 and len(scripted.order) == 3
    assert heard.lines[-1] == "not confirming again: vLLM's defaults were measured 3 times already"


def test_the_defaults_are_not_measured_again_past_the_budget(tmp_path, cpu_model):
    scripted = Scripted({None: [1.0, 0.9]})
    spec = parse_spec(spec_dict(cpu_model, n_trials=1, confirm_top_k=1, confirm_repeats=1))
    study = open_study("s", f"sqlite:///{tmp_path / 's.db'}", 0)
    heard = Heard()
    run = a_run(study, spec, tmp_path, scripted, heard, time_budget_s=0.001)
    assert run.add_trials() == 1 and run.confirm() == 0 and scripted.order == [None]
    assert heard.lines[-1].startswith(
        "not confirming: only vLLM's defaults served, and the 0 s left hold no measurement of "
        "it again (about "
    ), heard.lines
    assert heard.lines[-1].endswith("s); what is written was measured on 1 engine")


def test_a_confirmation_the_budget_stops_says_so(tmp_path, cpu_model):
    """A searched configuration and the defaults each measured once, and no time left for a
    fresh measurement: the run says the round stopped short, and that the baseline is kept."""
    scripted = Scripted({None: [1.0] * 4, 4: [0.5] * 4})
    spec = parse_spec(spec_dict(cpu_model, n_trials=2, confirm_top_k=1, confirm_repeats=3))
    study = open_study("s", f"sqlite:///{tmp_path / 's.db'}", 0)
    first = a_run(study, spec, tmp_path, scripted, Heard())
    assert first.add_trials() == 2
    heard = Heard()
    later = a_run(study, spec, tmp_path, scripted, heard, time_budget_s=0.001)
    assert later.confirm() == 0 and len(scripted.order) == 2
    assert heard.lines[0] == CONFIRMING
    assert heard.lines[-1].startswith(
        "time budget: the confirmation stopped after 0 fresh measurements, 0 s left of about "
    ), heard.lines
    assert heard.lines[-1].endswith(
        " s each; the finalist measured 0 and the baseline 0 of the 3 each asked for: the "
        "baseline is kept (no verdict from fewer; a larger --time-budget-s or --confirm-only "
        "confirms in full)"
    )
    written = later.result()
    assert written is not None and written.choice.outcome == DEFAULTS
    # With the time to finish, nothing of the kind is said, and the round confirms.
    done = Heard()
    run = a_run(study, spec, tmp_path, scripted, done)
    assert run.confirm() == 6
    assert not any(line.startswith("time budget") for line in done.lines)
    written = run.result()
    assert written is not None and written.choice.outcome == TUNED


def test_a_budget_is_planned_and_told_before_the_first_trial(tmp_path, cpu_model):
    scripted = Scripted({None: [1.0], 4: [0.5], 8: [0.6]})
    spec = parse_spec(spec_dict(cpu_model, confirm_top_k=0, n_trials=3))
    study = open_study("s", f"sqlite:///{tmp_path / 's.db'}", 0)
    heard = Heard()
    run = a_run(study, spec, tmp_path, scripted, heard, time_budget_s=3600.0)
    assert run.budget is not None and run.budget_s == 3600.0
    run.calibrate()
    assert run.add_trials() == 3
    # Before the first trial from the estimate, then after each trial but the last from the
    # costs measured (the first priced as a later trial: a cold start and a capacity search
    # from scratch), of the trials left.
    assert [line.rsplit(", ", 1)[-1] for line in heard.lines] == [
        "estimated)",
        "measured)",
        "measured)",
    ]
    assert heard.lines[0].startswith("the budget buys about 3 of the 3 trials (about ")
    assert heard.lines[1].startswith("the budget buys about 2 more of the 2 trials left (about ")
    assert heard.lines[2].startswith("the budget buys about 1 more of the 1 trial left (about ")


def test_a_run_without_a_launcher_measures_nothing(tmp_path, cpu_model):
    raw = spec_dict(cpu_model, time_scale="auto")
    spec = parse_spec(raw)
    study = open_study("s", f"sqlite:///{tmp_path / 's.db'}", 0)
    only_result = resolve(spec, "s", tmp_path / "runs", tmp_path / "s.yaml")
    run = Run(study, spec, workload(tmp_path, spec), only_result)
    assert run.calibrates and run.budget is None and run.machine == {}
    # The calibration would start vLLM's defaults: refused, as the study has none to reuse.
    with pytest.raises(InputError, match="no calibration yet"):
        run.calibrate()
    with pytest.raises(ValueError, match="without a launcher"):
        run.add_trials()
    assert run.result() is None  # no trial served: nothing written
    assert not (tmp_path / "s.yaml").exists()
