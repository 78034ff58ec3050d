"""The outcome as JSON (``tuner run --json``, ``tuner report --json``): one document built from
the study, the same from either command, saying what ``choose`` chose and the exit status
``tuner run`` gave.

Studies are ``test_confirm``'s scripted ones (real Optuna studies in SQLite, scores per
configuration and measurement, NaN an engine that did not start); ``tuner run --n-trials 0``
then writes the configuration and its JSON, as after a real run.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from conftest import run_tuner
from test_confirm import Scripted, run_scripted

from tuner.cli.exits import EXIT_DEFAULTS_KEPT, EXIT_FAILED, EXIT_MEETS_SLOS, EXIT_MISSES_SLOS
from tuner.cli.main import main
from tuner.cli.result_json import SCHEMA_VERSION
from tuner.study.result.choice import DEFAULTS, MISSES, TUNED, UNCONFIRMED, choose
from tuner.study.trials.groups import groups

NAN = math.nan
# Each outcome: scores per configuration (max-num-seqs; None the baseline), fresh measurements
# per configuration (0: no confirmation), the spec's overrides, trials; the outcome, the exit
# status, and whether a test on fresh engines ran.
PATHS = {
    # Fresh: the finalist 0.275, 0.25, 0.3 against the defaults' 0.55, 0.5, 0.6: 2x.
    "tuned": (
        {None: [0.45, 0.55, 0.5, 0.6], 4: [0.2, 0.275, 0.25, 0.3], 8: [0.8]}, 3, {}, 3,
        TUNED, EXIT_MEETS_SLOS, True,
    ),
    # The finalist's third fresh measurement is worse than the defaults' third: compared, lost.
    "defaults-lost": (
        {None: [0.99, 0.97, 0.96, 0.9], 4: [0.8, 0.85, 0.75, 0.95], 8: [3.0]}, 3, {}, 3,
        DEFAULTS, EXIT_DEFAULTS_KEPT, True,
    ),
    # The confirmation off: the defaults kept, never compared.
    "defaults-uncompared": (
        {None: [0.9], 4: [0.8], 8: [3.0]}, 0, {"confirm_repeats": 0}, 3,
        DEFAULTS, EXIT_DEFAULTS_KEPT, False,
    ),
    # The defaults miss the SLO; trial 1 meets it, with no fresh measurement behind it.
    "unconfirmed": (
        {None: [1.5], 4: [0.8], 8: [3.0]}, 0, {"confirm_repeats": 0}, 3,
        UNCONFIRMED, EXIT_MISSES_SLOS, False,
    ),
    "misses": ({None: [1.5], 4: [1.2], 8: [3.0]}, 3, {}, 3, MISSES, EXIT_MISSES_SLOS, False),
    "none": ({None: [NAN, NAN], 4: [NAN], 8: [NAN]}, 3, {}, 4, "none", EXIT_FAILED, False),
}  # fmt: skip


def scripted_study(tmp_path: Path, model: Path, path: str) -> tuple[Any, list[str]]:
    scores, repeats, given, trials, *_ = PATHS[path]
    overrides: dict[str, Any] = dict(given)
    study, _, args = run_scripted(
        tmp_path, model, Scripted(scores), top_k=1 if repeats else 0, repeats=repeats or 3,
        trials=trials, **overrides,
    )  # fmt: skip
    return study, args


def report_args(tmp_path: Path, *more: str) -> list[str]:
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    return ["report", "s", "--storage", storage, "--configs", str(tmp_path / "configs"), *more]


@pytest.mark.parametrize("path", list(PATHS))
def test_run_and_report_give_one_document_of_what_choose_chose(tmp_path, cpu_model, capsys, path):
    *_, outcome, code, compared = PATHS[path]
    study, args = scripted_study(tmp_path, cpu_model, path)
    ran = tmp_path / "run.json"
    assert main([*args, "--json", str(ran)]) == code
    document = json.loads(ran.read_text())
    capsys.readouterr()
    assert main(report_args(tmp_path, "--json", "-")) == 0
    assert json.loads(capsys.readouterr().out) == document
    assert document["schema"] == SCHEMA_VERSION and document["study"] == "s"
    assert document["objective"] == {"mode": "latency", "metric": "score", "direction": "minimize"}
    assert document["outcome"] == outcome and document["exit_status"] == code
    assert document["compared"] is compared
    assert document["slos"] == {"ttft_p95_s": 2.0, "error_rate": 0.0}
    choice = choose(study)
    numbers = [g.number for g in groups(study)]
    assert [c["trial"] for c in document["configurations"]] == numbers
    if choice is None:
        assert document["written"] is None and document["gain"] is None
        why = "no trial served its window; first failure: trial 0: vLLM exited with status 1"
        assert document["why"] == why
        assert not (tmp_path / "configs" / "s.yaml").exists()
        return
    assert document["why"] == choice.why
    written = document["written"]
    assert written["trial"] == choice.trial.number
    assert written["configuration"] == choice.group.number
    assert written["median"] == pytest.approx(choice.group.median)
    assert written["measurements"] == list(choice.measurements)
    assert written["meets_slos"] is choice.meets_slos
    assert written["path"] == str(tmp_path / "configs" / "s.yaml")
    assert f"# Study 's', trial {written['trial']}." in Path(written["path"]).read_text()
    assert [c["trial"] for c in document["configurations"] if c["written"]] == [choice.group.number]
    roles = {c["trial"]: c["role"] for c in document["configurations"]}
    assert roles[0] == "baseline"
    for configuration in document["configurations"]:
        group = next(g for g in groups(study) if g.number == configuration["trial"])
        assert configuration["median"] == pytest.approx(group.median)
        assert configuration["feasible"] is group.feasible
        values = [m["value"] for m in configuration["measurements"]]
        assert values == pytest.approx(group.values)


def test_a_tuned_configuration_s_gain_is_the_header_s_in_numbers(tmp_path, cpu_model, capsys):
    _, args = scripted_study(tmp_path, cpu_model, "tuned")
    ran = tmp_path / "run.json"
    assert main([*args, "--json", str(ran)]) == EXIT_MEETS_SLOS
    document = json.loads(ran.read_text())
    # As the header says it: 50% better by the median (2.00x, 90% interval 1.67 to 2.40x; 3
    # fresh engines each, p = 0.05).
    assert "50% better by the median (2.00x, 90% interval 1.67 to 2.40x" in document["why"]
    gain = document["gain"]
    assert gain["fraction"] == pytest.approx(0.5) and gain["ratio"] == pytest.approx(2.0)
    assert gain["low"] == pytest.approx(0.5 / 0.3) and gain["high"] == pytest.approx(2.4)
    assert gain["confidence"] == 0.9 and gain["fresh"] == 3
    assert f"p = {gain['p_value']:.2g})" in document["why"]
    assert document["confirmation"] == {
        "finalist": 1, "baseline": 0, "finalist_fresh": [3, 6, 7], "baseline_fresh": [4, 5, 8],
        "failed": [], "against": None, "confirmed": True,
    }  # fmt: skip
    written = document["written"]
    assert written["trial"] == 3 and written["engine_args"] == {"max-num-seqs": 4}
    assert written["baseline"] == {"trial": 0, "median": 0.55, "measurements": [4, 5, 8]}
    finalist = next(c for c in document["configurations"] if c["trial"] == 1)
    assert finalist["role"] == "finalist"
    assert [(m["trial"], m["fresh"]) for m in finalist["measurements"]] == [
        (1, False), (3, True), (6, True), (7, True),
    ]  # fmt: skip


def test_defaults_kept_say_whether_the_finalist_was_compared(tmp_path, cpu_model):
    lost, uncompared = tmp_path / "lost", tmp_path / "uncompared"
    for folder, path in ((lost, "defaults-lost"), (uncompared, "defaults-uncompared")):
        folder.mkdir()
        _, args = scripted_study(folder, cpu_model, path)
        assert main([*args, "--json", str(folder / "run.json")]) == EXIT_DEFAULTS_KEPT
    compared = json.loads((lost / "run.json").read_text())
    assert compared["compared"] and compared["gain"] is None
    assert compared["confirmation"]["against"] == [7, 8]
    assert not compared["confirmation"]["confirmed"]
    assert compared["written"]["closest"]["trial"] == 1
    never = json.loads((uncompared / "run.json").read_text())
    assert not never["compared"] and never["gain"] is None


def test_json_on_standard_output_is_the_document_alone(tmp_path, cpu_model):
    _, args = scripted_study(tmp_path, cpu_model, "misses")
    ran = run_tuner(*args, "--json", "-", cwd=tmp_path)
    assert ran.returncode == EXIT_MISSES_SLOS, ran.stderr
    document = json.loads(ran.stdout)
    assert document["outcome"] == MISSES and document["exit_status"] == ran.returncode
    # What the run says for people went to standard error.
    assert "no trial met the SLOs; wrote the closest" in ran.stderr
    reported = run_tuner(*report_args(tmp_path, "--json", "-"), cwd=tmp_path)
    assert reported.returncode == 0, reported.stderr
    assert json.loads(reported.stdout) == document


def test_json_is_checked_before_the_run(tmp_path, cpu_model, capsys):
    _, args = scripted_study(tmp_path, cpu_model, "misses")
    assert main([*args, "--json", str(tmp_path / "missing" / "run.json")]) == 2
    assert "--json" in capsys.readouterr().err
    # Standard output is shared by the workers of --gpus and carries nothing of --no-confirm's;
    # a server at a URL is measured once, with no configuration to write.
    assert main([*args, "--no-confirm", "--json", "-"]) == 2
    assert main([*args, "--gpus", "all", "--json", "-"]) == 2
    assert "give --json a file" in capsys.readouterr().err
    url = ["--server-url", "http://127.0.0.1:9", "--json", str(tmp_path / "url.json")]
    assert main([*args[:-2], *url]) == 2
    assert "--json does not apply" in capsys.readouterr().err
    assert not (tmp_path / "url.json").exists()
