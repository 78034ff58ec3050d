"""The noise-aware winner: the top configurations and the baseline re-measured in turns, the
winner chosen by its median, and the margin over vLLM's defaults judged against the spread.

Studies are real Optuna studies in SQLite, filled through ``run_study`` and ``confirm`` with a
stand-in runner whose scores are scripted per configuration and measurement; ``tuner run
--n-trials 0`` then writes the configuration, as after a real run.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import optuna
import pytest
from conftest import REPO, cpu_spec, run_tuner, write_small_trace, write_spec

from tuner.cli.exits import EXIT_DEFAULTS_KEPT, MEETS_SLOS_EXITS
from tuner.cli.main import main
from tuner.load.health import CLIENT_BEHIND
from tuner.load.http import ReplaySettings
from tuner.report.build import read_report, write_report
from tuner.study.measure.record import CONFIRMS_ATTR
from tuner.study.measure.scoring import Score, score
from tuner.study.measure.trial import Criteria, TrialOutcome, TrialSetup
from tuner.study.plan.spec import parse_spec
from tuner.study.result.choice import DEFAULTS, MISSES, TUNED, changed, choose
from tuner.study.trials import picks
from tuner.study.trials.confirm import confirm
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
        "objective": {"ttft_p95_s": 1.0},
        "window_s": 5,
    }
    return spec | overrides


class Scripted:
    """Scores by configuration (max-num-seqs, None for the baseline) and measurement."""

    def __init__(
        self, scores: Mapping[int | None, Sequence[float]], behind: Sequence[int | None] = ()
    ) -> None:
        self.scores = {k: list(v) for k, v in scores.items()}
        # Configurations whose re-measurements are flagged as trial.py flags a window whose
        # client fell behind (their first measurement is not).
        self.behind = set(behind)
        self.order: list[int | None] = []

    def __call__(self, args, setup, workdir, should_stop=None) -> TrialOutcome:
        seqs = args.get("max-num-seqs")
        again = seqs in self.order
        self.order.append(seqs)
        value = self.scores[seqs].pop(0)
        metrics = {"ttft_p95_s": value * SLO_S, "error_rate": 0.0}
        scored = score(metrics, {"ttft_p95_s": SLO_S}, {"ttft_p95_s": 1.0})
        if again and seqs in self.behind:
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
):
    raw = spec_dict(model, confirm_candidates=candidates)
    spec = parse_spec(raw)
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    setup = TrialSetup(
        model=spec.model,
        requests=(),
        replay=ReplaySettings(model="m", vocab_size=100),
        criteria=Criteria(spec.slos, spec.weights),
    )
    study = open_study("s", storage, 0)
    run_study(study, spec, setup, tmp_path / "runs", 3, runner=scripted, measured_on={})
    how = Measuring(setup, tmp_path / "runs", runner=scripted)
    ran = confirm(study, how, top_k, repeats, candidates=candidates)
    trace = tmp_path / "trace.csv"
    write_small_trace(trace)
    args = [
        "run", "--trace", str(trace), "--study", "s", "--spec",
        str(write_spec(tmp_path / "spec.yaml", raw)), "--storage", storage, "--n-trials", "0",
        "--configs", str(tmp_path / "configs"),
    ]  # fmt: skip
    return study, ran, args


def test_a_lucky_first_measurement_loses_to_the_median(tmp_path, cpu_model, capsys):
    scripted = Scripted(
        {
            None: [1.0, 1.05, 0.98],  # the baseline
            4: [0.5, 0.9, 0.95],  # lucky once, then slower
            8: [0.6, 0.58, 0.62],
        }
    )
    study, ran, args = run_scripted(tmp_path, cpu_model, scripted, top_k=2, repeats=2)
    # The first three trials, then the top two and the baseline in turns, twice, best first:
    # after the first turn 8 (median 0.59) leads 4 (0.7).
    assert scripted.order == [None, 4, 8, 4, 8, None, 8, 4, None]
    assert ran == 6
    trials = study.get_trials()
    assert [t.user_attrs.get(CONFIRMS_ATTR) for t in trials] == [None] * 3 + [1, 2, 0, 2, 1, 0]
    assert all(t.params == trials[t.user_attrs.get(CONFIRMS_ATTR, t.number)].params for t in trials)
    result = choose(study)
    assert result is not None and result.outcome == TUNED
    assert result.group.number == 2 and result.group.median == pytest.approx(0.6)
    assert result.trial.number == 2  # 0.6: its first measurement
    # Before the confirmation, trial 1 led: the winner changed.
    assert min(trials[:3], key=lambda t: t.value).number == 1

    assert main(args) == 0
    out = capsys.readouterr().out
    header = (tmp_path / "configs" / "s.yaml").read_text()
    assert "# Study 's', trial 2." in header and "max-num-seqs: 8" in header
    assert "# winner trial 2: score median 0.6 of 3 (0.58 to 0.62; trials 2, 4, 6)" in header
    assert "#   it sets max-num-seqs=8" in header
    assert "# defaults trial 0: score median 1 of 3 (0.98 to 1.05; trials 0, 5, 8)" in header
    assert "# beats vLLM's defaults beyond the measured spread: 40% better by the median" in header
    assert "winner trial 2" in out


def test_a_lead_inside_the_spread_keeps_the_defaults(tmp_path, cpu_model, capsys):
    scripted = Scripted({None: [1.0, 0.7, 1.1], 4: [0.8, 0.85, 0.75], 8: [3.0]})
    study, _, args = run_scripted(tmp_path, cpu_model, scripted, top_k=1, repeats=2)
    assert scripted.order == [None, 4, 8, 4, None, 4, None]  # 8 missed the SLO: not confirmed
    result = choose(study)
    assert result is not None and result.outcome == DEFAULTS
    assert result.closest is not None and result.closest.number == 1
    assert result.trial.number in (0, 4, 6) and result.group.number == 0
    assert main(args) == EXIT_DEFAULTS_KEPT
    header = (tmp_path / "configs" / "s.yaml").read_text()
    assert "max-num-seqs" not in header.split("# Serve with")[1]  # vLLM's defaults, as measured
    assert (
        "# vLLM's defaults kept: no searched configuration beats them beyond the measured "
        "spread: the closest, trial 1, is 20% better by the median, within the spread"
    ) in header
    assert "# closest searched trial 1: score median 0.8 of 3" in header
    assert "#   it sets max-num-seqs=4" in header
    assert "vLLM's defaults kept (trial" in capsys.readouterr().out


def test_more_re_measurements_show_a_gain_that_overlaps_once(tmp_path, cpu_model, capsys):
    """Four measurements each: the winner's worst (0.95) is worse than the defaults' best
    (0.9), but it wins 15 of the 16 pairs, which 2 of the 70 ways to deal the eight scores do:
    beyond chance. "Better in every measurement" would have kept the defaults."""
    scripted = Scripted({None: [1.0, 1.05, 0.98, 0.9], 4: [0.8, 0.85, 0.75, 0.95], 8: [3.0]})
    study, _, args = run_scripted(tmp_path, cpu_model, scripted, top_k=1, repeats=3)
    assert scripted.order == [None, 4, 8, 4, None, 4, None, 4, None]
    result = choose(study)
    assert result is not None and result.outcome == TUNED and result.group.number == 1
    assert main(args) == 0
    header = (tmp_path / "configs" / "s.yaml").read_text()
    assert (
        "# beats vLLM's defaults beyond chance: 17% better by the median, better in 15 of 16 "
        "pairs of measurements (a rank test: p <= 0.05)"
    ) in header


def test_the_baseline_winning_says_so_and_an_earlier_confirmation_is_kept(tmp_path, cpu_model):
    scripted = Scripted({None: [0.5, 0.55, 0.5], 4: [0.6, 0.9, 0.9], 8: [0.95]})
    study, ran, _ = run_scripted(tmp_path, cpu_model, scripted, top_k=1, repeats=2)
    # The baseline leads; the best searched configuration is measured as often as it anyway,
    # in turns, so that the defaults are kept on like against like.
    assert scripted.order == [None, 4, 8, 4, None, 4, None] and ran == 4
    result = choose(study)
    assert result is not None and result.outcome == DEFAULTS and result.group.number == 0
    assert result.closest is not None and result.closest.number == 1
    assert result.closest.measured == result.group.measured == 3
    assert "the closest, trial 1, is 80% worse by the median" in result.why, result.why
    # Run again: every configuration it would confirm has its measurements already.
    setup = TrialSetup(
        model="m", requests=(), replay=ReplaySettings(model="m", vocab_size=100),
        criteria=Criteria({"ttft_p95_s": SLO_S}, {"ttft_p95_s": 1.0}),
    )  # fmt: skip
    assert confirm(study, Measuring(setup, tmp_path, runner=scripted), 1, 2) == 0


def test_nothing_is_measured_again_where_no_configuration_met_the_slos(tmp_path, cpu_model):
    # A winner is held against the baseline; with none, re-measuring the baseline (on a slow
    # machine, minutes of an engine that misses every SLO) would change no answer.
    scripted = Scripted({None: [1.5], 4: [1.2], 8: [3.0]})
    study, ran, _ = run_scripted(tmp_path, cpu_model, scripted, top_k=2, repeats=2)
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
    # over one measured once, however lucky: like against like.
    result = choose(study)
    assert result is not None and result.outcome == TUNED and result.group.number == 1


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


def test_re_measurements_whose_client_fell_behind_count_as_taken(tmp_path, cpu_model):
    # The H100 study of benchmarks/results/h100.md: every re-measurement of the baseline was
    # flagged, none entered its median, and the confirmation measured it again until the time ran
    # out (six times). Flagged re-measurements are left out of the median but count as taken.
    scripted = Scripted({None: [0.9, 0.8, 0.8, 0.8, 0.8], 4: [0.5, 0.5, 0.5], 8: [0.7]}, [None])
    study, ran, _ = run_scripted(tmp_path, cpu_model, scripted, top_k=1, repeats=2)
    assert ran == 4 and scripted.order == [None, 4, 8, 4, None, 4, None]
    result = choose(study)
    assert result is not None and result.outcome == TUNED
    assert result.group.number == 1 and len(result.group.values) == 3
    baseline = result.baseline
    assert baseline is not None and baseline.values == [0.9] and baseline.measured == 3
    assert [t.user_attrs[CLIENT_BEHIND] for t in baseline.left_out] == [1.0, 1.0]


def test_a_leader_that_falls_back_hands_its_turns_to_the_next(tmp_path, cpu_model, capsys):
    # The demo's case: the baseline leads on one measurement; with top_k 1 the best searched
    # configuration (trial 2) is re-measured beside it, in turns, best first.
    scripted = Scripted({None: [0.52, 0.69, 0.71], 4: [0.9], 8: [0.57, 0.6, 0.55]})
    study, _, args = run_scripted(tmp_path, cpu_model, scripted, top_k=1, repeats=2)
    assert scripted.order == [None, 4, 8, 8, None, 8, None]
    result = choose(study)
    assert result is not None and result.closest is not None and result.closest.number == 2
    assert result.closest.median == pytest.approx(0.57)
    assert result.baseline is not None and len(result.baseline.values) == 3
    # Its worst (0.6) is not better than the baseline's best (0.52): noise, so the defaults stay.
    assert result.outcome == DEFAULTS
    assert main(args) == EXIT_DEFAULTS_KEPT
    header = (tmp_path / "configs" / "s.yaml").read_text()
    assert "within the spread" in header and "# vLLM's defaults kept: " in header


def test_the_spec_candidates_are_re_measured_and_held_against_the_winner(
    tmp_path, cpu_model, capsys
):
    # The hand-tuned configuration of a GPU study is a candidate: with confirm_candidates it is
    # re-measured in the turns too, and the verdict holds the winner against its spread.
    scripted = Scripted({None: [1.0, 1.05, 0.98], 4: [0.9, 0.85, 0.95], 8: [0.5, 0.55, 0.52]})
    study, ran, args = run_scripted(tmp_path, cpu_model, scripted, 1, 2, candidates=True)
    # The top one (8, a candidate itself), the baseline, then candidate 4, in turns.
    assert scripted.order == [None, 4, 8, 8, None, 4, 8, None, 4] and ran == 6
    result = choose(study)
    assert result is not None and result.outcome == TUNED and result.group.number == 2
    assert [g.number for g in result.candidates] == [1, 2]
    assert main(args) == 0
    header = (tmp_path / "configs" / "s.yaml").read_text()
    assert "# candidate trial 1: score median 0.9 of 3 (0.85 to 0.95; trials 1, 5, 8)" in header
    assert "# beats candidate trial 1 beyond the measured spread" in header
    assert "candidate trial 2" not in header  # the winner itself
    assert "beats candidate trial 1" in capsys.readouterr().out


def test_a_candidate_inside_the_winner_s_spread_is_called_noise(tmp_path, cpu_model):
    scripted = Scripted({None: [1.0, 1.05, 0.98], 4: [0.6, 0.5, 0.7], 8: [0.5, 0.65, 0.52]})
    _, _, args = run_scripted(tmp_path, cpu_model, scripted, 1, 2, candidates=True)
    assert main(args) == 0
    header = (tmp_path / "configs" / "s.yaml").read_text()
    assert "# winner trial 2: score median 0.52 of 3" in header
    assert "# within noise of candidate trial 1" in header


def test_candidates_are_held_against_a_baseline_that_wins(tmp_path, cpu_model):
    scripted = Scripted({None: [0.5, 0.55, 0.52], 4: [0.9, 0.85, 0.95], 8: [0.7, 0.72, 0.75]})
    _, _, args = run_scripted(tmp_path, cpu_model, scripted, 1, 2, candidates=True)
    assert scripted.order == [None, 4, 8] + [8, None, 4] * 2
    assert main(args) == EXIT_DEFAULTS_KEPT
    header = (tmp_path / "configs" / "s.yaml").read_text()
    assert "# vLLM's defaults kept: nothing searched beat them: the closest, trial 2, is " in header
    assert "# candidate trial 2: score median 0.72 of 3 (0.7 to 0.75; trials 2, 3, 6)" in header
    assert "# beats candidate trial 1 beyond" in header
    assert "# beats candidate trial 2 beyond" in header


def test_without_the_option_candidates_are_not_re_measured(tmp_path, cpu_model):
    scripted = Scripted({None: [1.0, 1.05, 0.98], 4: [0.9], 8: [0.5, 0.55, 0.52]})
    _, ran, args = run_scripted(tmp_path, cpu_model, scripted, 1, 2)
    assert scripted.order == [None, 4, 8, 8, None, 8, None] and ran == 4
    assert main(args) == 0
    assert "candidate trial" not in (tmp_path / "configs" / "s.yaml").read_text()


@pytest.mark.vllm
def test_confirm_only_finishes_a_confirmation_and_adds_no_trial(tmp_path, cpu_model, stand_in_vllm):
    """A run cut short before its confirmation (a machine's time running out) is finished by
    ``tuner run --confirm-only`` on the same study: the top one and the baseline re-measured,
    no searched trial added; run again, it has nothing left to do."""
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
    assert "adding 0" in done.stdout and "confirming: the top 1 and the baseline" in done.stdout
    trials = optuna.load_study(study_name="s", storage=storage).trials
    repeats = sorted(t.user_attrs[CONFIRMS_ATTR] for t in trials if CONFIRMS_ATTR in t.user_attrs)
    assert len(trials) == 2 + len(repeats) and 0 in repeats and len(repeats) <= 2, repeats
    done = run_tuner(*args, "--confirm-only", cwd=tmp_path, env=stand_in_vllm, timeout_s=180)
    assert done.returncode in MEETS_SLOS_EXITS, done.stdout + done.stderr
    assert len(optuna.load_study(study_name="s", storage=storage).trials) == len(trials)
    assert "not confirming again" in done.stdout


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
    # Trial 1 has the lowest single score (0.5, lucky once); its configuration's median is 0.9.
    # Trial 2's configuration has the best median (0.6): tuner run writes trial 2, and the
    # report, which took the lowest single score before, names it too.
    scripted = Scripted({None: [1.0, 1.05, 0.98], 4: [0.5, 0.9, 0.95], 8: [0.6, 0.58, 0.62]})
    study, _, args = run_scripted(tmp_path, cpu_model, scripted, top_k=2, repeats=2)
    assert picks.best_trial(study).number == 1  # what the report chose before
    written, page = written_and_reported(tmp_path, args)
    assert written == 2
    assert chosen_rows(page) == ["2"]
    assert verdict_columns(page) == [
        "trial 2: best, candidate 1",
        "trial 0: vLLM&#x27;s defaults",
        "trial 1: candidate 0",
    ]
    said = (
        "Trial 2 meets every SLO (the median of its 3 measurements: trials 2, 4 and 6), with "
        "the best median score of 3 feasible configurations."
    )
    assert said in page
    assert "<li>winner trial 2: score median 0.6 of 3 (0.58 to 0.62; trials 2, 4, 6)</li>" in page
    assert "<code>tuner run</code> wrote trial 2 to " in page
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
    # The baseline's median measurement is its second (trial 4): the page calls it vLLM's
    # defaults, in one column, and does not show trial 0 beside it as another configuration.
    scripted = Scripted({None: [0.45, 0.5, 0.55], 4: [0.9], 8: [0.7, 0.75, 0.8]})
    _, _, args = run_scripted(tmp_path, cpu_model, scripted, top_k=1, repeats=2)
    written, page = written_and_reported(tmp_path, args)
    assert written == 4 and chosen_rows(page) == ["4"]
    assert verdict_columns(page) == [
        "trial 4: best, vLLM&#x27;s defaults",
        "trial 2: closest searched, candidate 1",
        "trial 1: candidate 0",
    ]
    kept = "It is vLLM's own defaults, kept: nothing searched beat them: the closest, trial 2, is "
    assert kept + "50% worse by the median." in page


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


def _args_study(searched: dict[str, Any]) -> optuna.Study:
    study = optuna.create_study(direction="minimize")
    for args, baseline in [({}, True), (searched, False)]:
        attrs = {"feasible": True, "engine_args": args, "baseline": baseline or None}
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
