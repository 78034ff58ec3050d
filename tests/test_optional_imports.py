"""What runs without the packages only one command needs: every command but ``tuner trace
from-prometheus`` starts where prometheus-api-client is not installed (a GPU image that holds
vLLM and tuner's own needs), and that one says what is missing only when it queries."""

from __future__ import annotations

import subprocess
import sys

# Run in a fresh interpreter where importing prometheus_api_client fails, as where it is absent.
BLOCKED = """
import sys
sys.modules["prometheus_api_client"] = None
from tuner.cli import main
sys.argv = ["tuner", *sys.argv[1:]]
main()
"""


def _tuner(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", BLOCKED, *args], capture_output=True, text=True, timeout=120
    )


def test_the_cli_starts_without_prometheus_api_client():
    for args in (("--help",), ("run", "--help"), ("init", "--help"), ("report", "--help")):
        done = _tuner(*args)
        assert done.returncode == 0, (args, done.stderr[-2000:])
        assert "usage: tuner" in done.stdout


def test_a_prometheus_query_needs_it():
    code = (
        "import sys; sys.modules['prometheus_api_client'] = None\n"
        "from tuner.traces.prometheus_http import Access, Connection\n"
        "Connection('http://127.0.0.1:9', Access())\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "reading Prometheus needs prometheus-api-client" in done.stderr
