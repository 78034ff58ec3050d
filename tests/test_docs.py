"""What users read: README.md, CONTRIBUTING.md and docs/*.md, and the comments of the specs
tuner writes (``tuner init``) and ships (``studies/*.yaml``).

They cite measurements by linking the results file under ``benchmarks/results/``, which carries
the date and the commit: no date and no commit hash in the text itself. Every relative link,
every repository path in backticks, and every ``tests/FILE.py::test_name`` they name exists.
The README's trace table shows one example record per format; each is detected as its format.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tuner.engine.environment import Gpu, HostMemory
from tuner.study.plan.space import default_spec_text
from tuner.traces.formats import detect_format, load_trace

REPO = Path(__file__).resolve().parent.parent
PAGES = sorted([REPO / "README.md", REPO / "CONTRIBUTING.md", *(REPO / "docs").glob("*.md")])

# A calendar date: dates of measurements belong to the results files.
DATE = re.compile(r"(?<!\d)(?:19|20)\d\d-[01]\d-[0-3]\d(?![\d:])")
# A word of 7 to 40 hex digits, at least one a digit and one a letter, standing alone or in
# backticks: a git commit. Longer runs (a sha256) and parts of words, paths or URLs are not.
HEX_WORD = re.compile(r"(?<![\w./:#=-])[0-9a-f]{7,40}(?![\w/=-])")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
# Backticked paths into the repository (placeholders such as NAME aside), with an optional
# ``::test_name``.
REPO_PATH = re.compile(r"`((?:benchmarks|docs|tests|tuner|traces|\.ci)/[^`\s]*?)(?:::(\w+))?`")
PLACEHOLDER = re.compile(r"NAME|\.\.\.|[*<>]")


def commit_hashes(text: str) -> list[str]:
    return [
        word
        for word in HEX_WORD.findall(text)
        if re.search(r"\d", word) and re.search(r"[a-f]", word)
    ]


def lab_notes(text: str) -> list[str]:
    """The dates and commit hashes in ``text``."""
    return DATE.findall(text) + commit_hashes(text)


def slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return {slug(m) for m in re.findall(r"^#{1,6} (.+)$", text, flags=re.M)}


def test_the_checks_catch_what_they_are_for():
    old = "measured 2026-11-26 (tuner cb19280; `9440a9a`), commit 151742d."
    assert lab_notes(old) == ["2026-11-26", "cb19280", "9440a9a", "151742d"]
    assert lab_notes("2023-11-16 18:42:26.8210270,391,97") == ["2023-11-16"]
    fine = (
        "sha256 5e4880b76523a4991247d3c9c3f30ad9d4ee1e6a52b2"
        "20543d20ac666250fed9 max-num-seqs 1024, 125.9 req/s, float32, deadbeef, 1234567, "
        "benchmarks/results/h100-user-study/ e2e_p99_s 0x1f2e3d4c https://x.org/abc1234def"
    )
    assert lab_notes(fine) == []
    assert slug("Your trace: `tuner trace inspect`") == "your-trace-tuner-trace-inspect"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_no_dates_or_commits_in_what_users_read(page):
    assert lab_notes(page.read_text()) == [], f"{page.name}: link the results file instead"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_points_at_a_file_that_exists(page):
    broken = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):
            continue
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists() or (
            anchor and resolved.suffix == ".md" and anchor not in anchors(resolved)
        ):
            broken.append(target)
    assert broken == [], f"{page.name}: broken links"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_repository_path_named_exists(page):
    missing = []
    for path, test in REPO_PATH.findall(page.read_text()):
        if PLACEHOLDER.search(path):
            continue
        file = REPO / path
        if not file.exists():
            missing.append(path)
        elif test and not re.search(rf"^def {test}\(", file.read_text(), flags=re.M):
            missing.append(f"{path}::{test}")
    assert missing == [], f"{page.name}: named but not in the repository"


SPECS = {
    "cpu": default_spec_text(),
    "cpu, a model": default_spec_text("m", cpu_memory=HostMemory(16 << 30, 8 << 30)),
    "gpu": default_spec_text("m", gpu=True, prompt_tokens=list(range(10, 201))),
    "gpu capacity": default_spec_text(
        "m",
        gpu=True,
        device=Gpu(0, "GPU-1", "NVIDIA H100 80GB HBM3", 81559),
        overrides={"objective_mode": "capacity"},
        searches_rates=True,
    ),
    **{f"studies/{p.name}": p.read_text() for p in sorted((REPO / "studies").glob("*.yaml"))},
}


@pytest.mark.parametrize("name", SPECS)
def test_specs_written_and_shipped_carry_no_lab_notes(name):
    text = SPECS[name]
    assert lab_notes(text) == [], name
    for cited in re.findall(r"benchmarks/results/[\w./-]*\w/?", text):
        assert (REPO / cited).exists(), f"{name} cites {cited}"


def trace_table() -> list[tuple[str, str, str]]:
    """(format, fields, example) of each row of the README's trace table."""
    text = (REPO / "README.md").read_text()
    section = text.partition("\n## Your trace")[2].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        if len(cells) == 4 and cells[0].startswith("`"):
            rows.append((cells[0].strip("`"), cells[1], cells[3]))
    return rows


def test_the_readme_shows_every_detected_format():
    shown = {fmt for fmt, _, _ in trace_table()}
    assert shown >= {"canonical", "azure", "mooncake", "burstgpt", "bailian", "concurrency"}


@pytest.mark.parametrize(("fmt", "fields", "example"), trace_table(), ids=lambda v: v[:12])
def test_each_example_record_in_the_readme_reads_as_its_format(tmp_path, fmt, fields, example):
    if fmt == "columns":
        pytest.skip("named on the command line, not detected")
    shipped = LINK.findall(example)
    # A format whose records carry calendar dates (Azure's) is shown by a shipped trace's first
    # record rather than a date in the README.
    record = (
        (REPO / shipped[0]).read_text().splitlines()[1]
        if shipped
        else re.findall(r"`([^`]+)`", example)[-1]
    )
    header = "" if record.startswith("{") else re.findall(r"`([^`]+)`", fields)[0] + "\n"
    path = tmp_path / ("trace.jsonl" if record.startswith("{") else "trace.csv")
    path.write_text(header + record + "\n")
    assert detect_format(path) == fmt
    if fmt != "concurrency":
        assert len(load_trace(path).arrival_s) == 1


def test_the_readme_is_short_and_reaches_the_gpu_install_early():
    # The reference lives in docs/; the README says what tuner does, shows one result, and
    # gets a GPU user to the install within a screen or two.
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= 220
    assert lines.index("## Install") < 60
