"""What people look at, in a real browser: optuna-dashboard on a study tuner wrote, and the
HTML page of ``tuner report``.

Headless Chromium (the Debian package ``chromium``, which ``.ci/setup --tests`` installs) loads
each page and prints its DOM after the page's scripts ran (``--dump-dom``, with virtual time to
let them finish), or takes a screenshot. The study is ``benchmarks/results/cpu-demo/cpu-demo.db``,
written by a real ``tuner run`` of the quick start, copied. Screenshots go to
``$TUNER_SCREENSHOTS`` when set (``benchmarks/results/cpu-demo`` keeps the ones taken for the
docs), else to the test's temporary folder.
"""

from __future__ import annotations

import contextlib
import html
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import REPO

from tuner.engine.local import free_port
from tuner.report.build import write_report
from tuner.study.trials.search import open_study

DEMO_DB = REPO / "benchmarks" / "results" / "cpu-demo" / "cpu-demo.db"
# The configuration the run of DEMO_DB wrote (``configs/demo.yaml`` then).
DEMO_CONFIG = REPO / "tests" / "data" / "cpu-demo.yaml"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(
        CHROMIUM is None,
        reason="no chromium on PATH (.ci/setup --tests installs the Debian package)",
    ),
]
FIGURES = ["landscape.png", "trials.png", "history.png", "cost.png"]


def chromium(profile: Path, *args: str, timeout_s: float = 120) -> str:
    """Run headless Chromium to its end; return what it printed. Its helpers go with it."""
    assert CHROMIUM is not None
    command = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",  # CI runs as root
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--hide-scrollbars",
        "--no-first-run",
        f"--user-data-dir={profile}",
        *args,
    ]
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = process.communicate(timeout=timeout_s)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    assert process.returncode == 0, f"chromium exited {process.returncode}: {err[-2000:]}"
    return out


def dump_dom(profile: Path, url: str, budget_ms: int = 10000) -> str:
    return chromium(profile, f"--virtual-time-budget={budget_ms}", "--dump-dom", url)


def screenshot(profile: Path, url: str, path: Path, size: str) -> Path:
    chromium(profile, "--virtual-time-budget=10000", f"--window-size={size}",
             f"--screenshot={path}", url)  # fmt: skip
    assert path.read_bytes().startswith(b"\x89PNG")
    return path


def page_text(dom: str) -> str:
    """What a person reads: the DOM without scripts, styles and tags, one space between."""
    dom = re.sub(r"<(script|style)\b.*?</\1>", " ", dom, flags=re.DOTALL)
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", dom)))


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    folder = Path(os.environ.get("TUNER_SCREENSHOTS") or tmp_path / "shots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture
def demo(tmp_path: Path) -> str:
    copy = tmp_path / "demo.db"
    shutil.copy(DEMO_DB, copy)
    return f"sqlite:///{copy}"


@pytest.fixture
def dashboard(demo: str, tmp_path: Path) -> Iterator[str]:
    """optuna-dashboard serving the demo study; its URL. Stopped after the test."""
    # As every ``tuner run`` does, resumed or new: this names the objective for the dashboard
    # (the committed study predates that).
    open_study("demo", demo, 0)
    port = free_port()
    installed = Path(sys.executable).parent / "optuna-dashboard"
    program = str(installed) if installed.exists() else shutil.which("optuna-dashboard")
    assert program, "optuna-dashboard is not installed"
    log = (tmp_path / "dashboard.log").open("w")
    server = subprocess.Popen(
        [program, demo, "--port", str(port), "--host", "127.0.0.1"],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/api/studies", timeout=2).status_code == 200:
                    break
            assert server.poll() is None, (tmp_path / "dashboard.log").read_text()
            assert time.monotonic() < deadline, "optuna-dashboard did not answer in 60 s"
            time.sleep(0.3)
        yield url
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
        log.close()


def test_dashboard_shows_the_study_and_what_each_trial_measured(
    dashboard: str, tmp_path: Path, shots: Path
) -> None:
    studies = httpx.get(f"{dashboard}/api/studies").json()["study_summaries"]
    study_id = next(s["study_id"] for s in studies if s["study_name"] == "demo")
    profile = tmp_path / "profile"

    listing = page_text(dump_dom(profile, f"{dashboard}/dashboard"))
    assert "demo" in listing and "Direction: MINIMIZE" in listing

    # The study's page: the history plots the objective under its name.
    study_page = page_text(dump_dom(profile, f"{dashboard}/dashboard/studies/{study_id}"))
    assert re.search(r"\bHistory\b.*\by Axis score\b", study_page), study_page[:2000]

    # Trial 4 missed the TTFT SLO: its figures, feasibility and reason, as user attributes.
    url = f"{dashboard}/dashboard/studies/{study_id}/trials?numbers=4"
    trial = page_text(dump_dom(profile, url))
    assert "Trial 4 (trial_id=" in trial
    assert "User Attributes" in trial
    assert re.search(r"\bttft_p95_s 3\.20\d+", trial)  # 3206 ms, in seconds
    assert "feasible False" in trial
    assert "reason SLO missed: ttft_p95_s 3206 ms" in trial
    screenshot(profile, url, shots / "dashboard-trial.png", "1400,1300")
    screenshot(profile, f"{dashboard}/dashboard/studies/{study_id}", shots / "dashboard.png",
               "1400,1000")  # fmt: skip


# Runs once the page has loaded: each image, loaded or broken, into the DOM as JSON.
IMAGE_CHECK = """
<img title="control: a broken image" src="data:image/png;base64,AAAA">
<script>
window.addEventListener("load", () => {
  const images = Array.from(document.images).map((img) => ({
    title: img.title, complete: img.complete, width: img.naturalWidth, height: img.naturalHeight,
  }));
  const out = document.createElement("pre");
  out.id = "image-check";
  out.textContent = JSON.stringify(images);
  document.body.appendChild(out);
});
</script>
"""


def test_report_page_loads_every_figure_without_the_network(
    demo: str, tmp_path: Path, shots: Path
) -> None:
    configs = tmp_path / "configs"
    configs.mkdir()
    shutil.copy(DEMO_CONFIG, configs / "demo.yaml")
    page = write_report("demo", demo, tmp_path / "report", configs)
    # The page as written, with the check appended: same folder, same figures.
    checked = page.with_name("checked.html")
    checked.write_text(page.read_text().replace("</body>", IMAGE_CHECK + "</body>"))
    profile = tmp_path / "profile"
    # No network: any http(s) fetch would go to a proxy that is not there.
    offline = "--proxy-server=http://127.0.0.1:9"
    dom = chromium(profile, offline, "--virtual-time-budget=10000", "--dump-dom", checked.as_uri())
    found = re.search(r'<pre id="image-check">(.*?)</pre>', dom, flags=re.DOTALL)
    assert found, "the check did not run"
    images = json.loads(html.unescape(found[1]))
    by_title = {image["title"]: image for image in images}
    # The control shows that a broken image reads as one.
    assert by_title.pop("control: a broken image")["width"] == 0
    assert sorted(by_title) == sorted(FIGURES)
    for title, image in by_title.items():
        assert image["complete"] and image["width"] > 300 and image["height"] > 200, title

    text = page_text(dom)
    table = re.search(r'<table id="verdict-table">(.*?)</table>', dom, flags=re.DOTALL)
    assert table, "no verdict table"
    verdict = page_text(table[1])
    assert "trial 0: best, vLLM's defaults" in verdict
    assert "TTFT p95 2000 ms 541 ms" in verdict
    assert text.index("Verdict") < text.index("Trials") < text.index("Landscape")
    screenshot(profile, page.as_uri(), shots / "report.png", "1300,2200")
