"""Serve the configuration a study of the user's own server wrote, as its header says, and ask
the app one request of its own: the check that the written file serves (``user_capacity.sh
serve`` with ``SERVER``).

    PORT=8765 CONFIG=prod.yaml python3 serve_own.py SERVER_YAML OUT_JSON

``SERVER_YAML`` holds the spec's ``server:`` section (docs/own-server.md), read as ``tuner run``
reads it: the command is started with ``{port}`` and ``{config}`` filled in, as a process group
of its own (as tuner starts it), from the current folder; once its health path answers, one
request goes to its request path (vLLM's completions without one) with ``{prompt}`` a short
text, ``{output_tokens}`` 4 and ``{model}`` the config's model. The answer is written to
``OUT_JSON``; the app's output goes to stdout; the group is stopped. Exit 0 only where the app
answered 200.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import httpx
import yaml

from tuner.engine import signal_group, spawn
from tuner.study import SECTION, parse_server

PROMPT = "Hello world"
OUTPUT_TOKENS = 4
HEALTHY_WITHIN_S = 300.0
STOP_GRACE_S = 30.0


def main() -> int:
    server_yaml, out_json = Path(sys.argv[1]), Path(sys.argv[2])
    server = parse_server(str(server_yaml), yaml.safe_load(server_yaml.read_text())[SECTION])
    assert server is not None, f"{server_yaml}: no server section"
    port, config = os.environ.get("PORT", "8765"), os.environ["CONFIG"]
    model = str(yaml.safe_load(Path(config).read_text())["model"])
    argv = server.command.argv(port, config)
    if server.request is None:
        path = "/v1/completions"
        body = {"model": model, "prompt": PROMPT, "max_tokens": OUTPUT_TOKENS}
    else:
        path = server.request.path
        body = server.request.body_with(PROMPT, OUTPUT_TOKENS, model)
    began = time.monotonic()
    sys.stdout.flush()
    app = spawn(argv, sys.stdout.buffer, {})
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60.0) as client:
            while True:
                if (code := app.poll()) is not None:
                    print(f"the app exited with status {code} before it was healthy")
                    return 1
                try:
                    if client.get(server.command.health_path).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() - began > HEALTHY_WITHIN_S:
                    print(f"the app was not healthy within {HEALTHY_WITHIN_S:.0f} s")
                    return 1
                time.sleep(1.0)
            print(f"healthy after {time.monotonic() - began:.0f} s: {' '.join(argv)}")
            answer = client.post(path, json=body)
        out_json.write_text(
            json.dumps({"status": answer.status_code, "body": body, "answer": answer.text})
        )
        print(f"POST {path}: {answer.status_code}: {answer.text[:300]}")
        return 0 if answer.status_code == 200 else 1
    finally:
        signal_group(app.pid, signal.SIGTERM)
        app.wait(STOP_GRACE_S)
        signal_group(app.pid, signal.SIGKILL)
        app.wait(STOP_GRACE_S)


if __name__ == "__main__":
    sys.exit(main())
