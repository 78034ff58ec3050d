"""Serve the configuration a study of the user's own server wrote, as its header says, and ask
the app one request of its own: the check that the written file serves (``user_capacity.sh
serve`` with ``SERVER``).

    PORT=8765 CONFIG=prod.yaml python3 serve_own.py SERVER_YAML OUT_JSON

``SERVER_YAML`` holds the spec's ``server:`` section (docs/own-server.md): the command is started
with ``{port}`` and ``{config}`` filled in, in a session of its own, from the current folder;
once its health path answers, one request goes to its request path with the body's
``{prompt}`` a short text, ``{output_tokens}`` 4 and ``{model}`` the config's model. The answer
is written to ``OUT_JSON``; the app is stopped as a process group. Exit 0 only where the app
answered 200.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

PROMPT = "Hello world"
OUTPUT_TOKENS = 4
HEALTHY_WITHIN_S = 300.0


def filled(value: Any, model: str) -> Any:
    """The body's placeholders filled: a value that is one alone becomes the value."""
    if isinstance(value, dict):
        return {key: filled(item, model) for key, item in value.items()}
    if isinstance(value, list):
        return [filled(item, model) for item in value]
    if not isinstance(value, str):
        return value
    alone = {"{prompt}": PROMPT, "{output_tokens}": OUTPUT_TOKENS, "{model}": model}
    if value in alone:
        return alone[value]
    return value.replace("{prompt}", PROMPT).replace("{model}", model)


def main() -> int:
    server_yaml, out_json = Path(sys.argv[1]), Path(sys.argv[2])
    server = yaml.safe_load(server_yaml.read_text())["server"]
    port, config = os.environ.get("PORT", "8765"), os.environ["CONFIG"]
    model = str(yaml.safe_load(Path(config).read_text())["model"])
    command = server["command"].replace("{port}", port).replace("{config}", config)
    request = server.get("request") or {}
    path = request.get("path", "/v1/completions")
    body = filled(request.get("body", {"model": "{model}", "prompt": "{prompt}"}), model)
    began = time.monotonic()
    app = subprocess.Popen(shlex.split(command), start_new_session=True)
    try:
        base = f"http://127.0.0.1:{port}"
        with httpx.Client(base_url=base, timeout=60.0) as client:
            while True:
                if app.poll() is not None:
                    print(f"the app exited with status {app.returncode} before it was healthy")
                    return 1
                try:
                    if client.get(server.get("health_path", "/health")).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() - began > HEALTHY_WITHIN_S:
                    print(f"the app was not healthy within {HEALTHY_WITHIN_S:.0f} s")
                    return 1
                time.sleep(1.0)
            print(f"healthy after {time.monotonic() - began:.0f} s: {command}")
            answer = client.post(path, json=body)
        out_json.write_text(
            json.dumps({"status": answer.status_code, "body": body, "answer": answer.text})
        )
        print(f"POST {path}: {answer.status_code}: {answer.text[:300]}")
        return 0 if answer.status_code == 200 else 1
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(app.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            app.wait(timeout=30)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(app.pid, signal.SIGKILL)
        app.wait()


if __name__ == "__main__":
    sys.exit(main())
