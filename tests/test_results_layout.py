"""benchmarks/results/ in one layout: a folder per result whose README.md names the date, the
commit and the command that reruns it; no loose pages, scripts, raw logs or archives beside
them; a result's small files (the logs' last lines) are sections of its ``files.md``; every
relative link of those pages and of benchmarks/README.md resolves. And
``benchmarks/harness.py``, which the benchmark scripts write their results with, writes that
layout.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import optuna
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import harness

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"

DATE = re.compile(r"(?<!\d)20\d\d-[01]\d-[0-3]\d(?!\d)")
COMMIT = re.compile(r"(?<![\w./:#=-])[0-9a-f]{7,40}(?![\w/=-])")
# A command as typed: in backticks, indented or fenced, its environment variables first.
COMMAND = re.compile(r"^(?:\$ )?(?:[A-Z_]+=\S* )*(?:python3?|bash|tuner|pytest|flock|git) ")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
RAW = re.compile(r"\.(log|tar|tgz|gz|xz|zip)$")


def commits(text: str) -> list[str]:
    return [w for w in COMMIT.findall(text) if re.search(r"\d", w) and re.search(r"[a-f]", w)]


def commands(text: str) -> list[str]:
    """What the page shows as commands: backticked spans, indented lines, fenced lines."""
    fenced = re.findall(r"^```[^\n]*\n(.*?)^```", text, flags=re.S | re.M)
    lines = [*re.findall(r"`([^`\n]+)`", text), *re.findall(r"^ {4}(\S.*)$", text, flags=re.M)]
    lines += [line.strip() for block in fenced for line in block.splitlines()]
    return [line for line in lines if COMMAND.match(line)]


def tracked(folder: Path) -> list[Path]:
    """The files git tracks under ``folder`` (every file there outside a git checkout)."""
    try:
        names = subprocess.run(
            ["git", "-C", str(REPO), "ls-files", "-z", str(folder.relative_to(REPO))],
            capture_output=True,
            check=True,
        ).stdout.split(b"\0")
    except (OSError, subprocess.CalledProcessError):
        return [p for p in folder.rglob("*") if p.is_file()]
    return [REPO / n.decode() for n in names if n and (REPO / n.decode()).exists()]


def test_the_checks_read_what_a_page_names():
    page = "# T\n\nRun 2026-11-22 at `924c0e7`:\n\n```\ngit clone x\nFOO=1 bash y.sh\n```\n"
    assert DATE.findall(page) == ["2026-11-22"] and commits(page) == ["924c0e7"]
    assert commands(page) == ["git clone x", "FOO=1 bash y.sh"]
    assert commands("tuner's client, `tuner run --trace t.csv`, `python` alone") == [
        "tuner run --trace t.csv"
    ]


RESULT_FOLDERS = sorted(p for p in RESULTS.iterdir() if p.is_dir())


@pytest.mark.parametrize("folder", RESULT_FOLDERS, ids=lambda p: p.name)
def test_every_result_is_a_folder_whose_readme_names_date_commit_and_command(folder):
    readme = folder / "README.md"
    assert readme.is_file(), f"{folder.name}: no README.md"
    text = readme.read_text()
    missing = [
        what
        for what, found in (
            ("a date", DATE.search(text)),
            ("a commit", commits(text)),
            ("a command", commands(text)),
        )
        if not found
    ]
    assert missing == [], f"{folder.name}/README.md lacks {', '.join(missing)}"


def test_results_hold_only_folders_of_results_and_no_scripts_logs_or_archives():
    loose = [p.name for p in RESULTS.iterdir() if p.is_file() and p.name != ".gitignore"]
    assert loose == [], "a page of its own folder (NAME/README.md), or into its result's folder"
    unwanted = [
        str(p.relative_to(RESULTS))
        for p in tracked(RESULTS)
        if RAW.search(p.name) or p.suffix in {".py", ".sh"}
    ]
    assert unwanted == [], "scripts go to benchmarks/, raw logs become sections of files.md"


def test_a_result_s_small_files_are_sections_of_its_files_page():
    loose = [
        str(p.relative_to(RESULTS))
        for p in tracked(RESULTS)
        if p.name.endswith(".tail.txt") or p.name in {"env.txt", "completion.json", "summary.txt"}
    ]
    assert loose == [], "a log's last lines, the environment, a completion: a section of files.md"
    for page in RESULTS.rglob(harness.FILES):
        assert (page.parent / "README.md").is_file(), f"{page}: beside no result's README"
        assert sections(page.read_text()), f"{page}: no section"


PAGES = [REPO / "benchmarks" / "README.md", *sorted(RESULTS.rglob("*.md"))]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_of_the_benchmark_pages_resolves(page):
    broken = []
    for target in LINK.findall(page.read_text()):
        path = target.partition("#")[0]
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or not path:
            continue
        if not (page.parent / path).exists():
            broken.append(target)
    assert broken == [], f"{page.relative_to(REPO)}: broken links"


def a_study(path: Path) -> Path:
    study = optuna.create_study(study_name="s", storage=f"sqlite:///{path}")
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=2)
    return path


def sections(page: str) -> dict[str, str]:
    """The sections of a ``files.md``: each heading's name and its code block's text."""
    found = re.findall(r"^## ([^\n]+)\n\n(`{3,})\w*\n(.*?)^\2$", page, flags=re.S | re.M)
    return {name: text for name, _, text in found}


def test_the_harness_writes_a_result_folder(tmp_path):
    log = tmp_path / "run.log"
    log.write_text("".join(f"line {i}\n" for i in range(100)))
    db = a_study(tmp_path / "work.db")
    folder = tmp_path / "results" / "demo"
    folder.mkdir(parents=True)
    config = folder / "config.yaml"
    config.write_text("max-num-seqs: 8\n# ```a fence inside```\n")
    when = datetime(2026, 12, 3, 11, 40, tzinfo=UTC)
    readme = harness.write_result(
        folder,
        "A demo",
        "python benchmarks/x.py --n 2",
        "n  value\n2  0.5\n",
        data=[{"n": 2, "value": 0.5}],
        study_db=db,
        tails=[log],
        files=[config],
        commit="1234abc+changes",
        on="AMD EPYC, 2 cores",
        when=when,
    )
    lines = readme.read_text().splitlines()
    assert lines[:6] == [
        "# A demo",
        "",
        "- Date: 2026-12-03 11:40 UTC",
        "- Tuner commit: `1234abc+changes`",
        "- Command: `python benchmarks/x.py --n 2`",
        "- Machine: AMD EPYC, 2 cores",
    ]
    assert "n  value\n2  0.5\n```" in readme.read_text()  # what it printed, in the README only
    assert json.loads((folder / "summary.json").read_text()) == [{"n": 2, "value": 0.5}]
    kept = optuna.load_study(study_name="s", storage=f"sqlite:///{folder / 'study.db'}")
    assert len(kept.trials) == 2
    # One files.md of the small files, each a section under its name; a file given whole left
    # the folder for it, a log stays where it was (out of git).
    page = (folder / "files.md").read_text()
    assert sections(page) == {
        "run.tail.txt": "".join(f"line {i}\n" for i in range(40, 100)),
        "config.yaml": "max-num-seqs: 8\n# ```a fence inside```\n",
    }
    assert sorted(p.name for p in folder.iterdir()) == [
        "README.md",
        "files.md",
        "study.db",
        "summary.json",
    ]
    assert log.exists() and not (tmp_path / "run.tail.txt").exists()
    assert "[run.tail.txt](files.md#runtailtxt)" in readme.read_text()
    assert commands(readme.read_text()) and commits(readme.read_text())


def test_the_harness_names_the_commit_and_its_changes(tmp_path):
    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(tmp_path), *args], capture_output=True, text=True, check=True
        ).stdout.strip()

    git("init", "-q")
    (tmp_path / "f").write_text("a\n")
    git("add", "f")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "f")
    head = git("rev-parse", "--short", "HEAD")
    assert harness.git_commit(tmp_path) == head
    (tmp_path / "f").write_text("b\n")
    assert harness.git_commit(tmp_path) == head + "+changes"
    assert harness.git_commit(tmp_path / "nowhere") == "unknown"


def test_the_harness_command_line_writes_the_folder_a_shell_script_filled(tmp_path):
    folder = tmp_path / "qs"
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "run.log").write_text("run exit 0 in 12 s\n")
    printed = folder / "summary.txt"
    printed.write_text("== clone 1\nrun exit 0 in 12 s\n")
    command = "bash benchmarks/quickstart_clones.sh 1 qs"
    args = [str(folder), "--title", "Clones", "--command", command, "--summary", str(printed)]
    assert harness.main([*args, "--tail", str(folder / "1" / "run.log"), "--machine", "M"]) == 0
    text = (folder / "README.md").read_text()
    assert f"- Command: `{command}`" in text and "- Machine: M" in text
    assert DATE.search(text) and "run exit 0 in 12 s" in text
    assert sections((folder / "files.md").read_text()) == {"1/run.tail.txt": "run exit 0 in 12 s\n"}
    assert "[1/run.tail.txt](files.md#1runtailtxt)" in text


def test_the_machine_is_named():
    assert harness.machine().strip()
    cpuinfo = Path("/nonexistent/cpuinfo")
    assert harness.cpu_model(cpuinfo)
