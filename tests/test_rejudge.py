"""``benchmarks/rejudge.py``'s command line: ``--help`` is usage, not a storage path, and a
path that is not there is refused rather than created as an empty SQLite file."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import rejudge

SHIPPED = rejudge.RESULTS / "cpu-demo" / "cpu-demo.db"


def test_help_prints_usage_and_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exited:
        rejudge.main(["--help"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.startswith("usage: python benchmarks/rejudge.py")
    assert list(tmp_path.iterdir()) == []


def test_a_missing_path_is_refused_and_not_created(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exited:
        rejudge.main(["nothere.db"])
    assert exited.value.code == 2
    assert "no such file: nothere.db" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_a_study_file_is_judged_as_before(capsys):
    assert rejudge.main([str(SHIPPED)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"$ python benchmarks/rejudge.py {SHIPPED}"
    assert lines[1].startswith("results/cpu-demo/cpu-demo.db demo: finalist trial 1")
