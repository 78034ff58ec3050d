"""A stand-in for vLLM's OpenAI server, for tests where the point is a fault and not vLLM.

``conftest.stand_in_vllm`` installs this file as ``vllm/entrypoints/openai/api_server.py`` of a
``vllm`` package that comes first on ``PYTHONPATH``, so ``tuner run``, unchanged, starts it in
place of vLLM with either launcher (``python -m MODULE --config FILE``, or the zygote's fork).

Like vLLM, it serves ``/health``, ``/metrics`` and streamed ``/v1/completions`` on the host and
port of its ``--config``, and starts a worker process (vLLM's engine core) that it stops on
SIGTERM. Set in the environment:

- ``STAND_IN_TOKEN_S``: seconds per output token (default 0.002);
- ``STAND_IN_PIDS``: a folder where each process writes a file named by its pid;
- ``STAND_IN_SLOTS``: requests streamed at once (default: no limit); the others wait for a slot
  before their first token, so the server has a capacity, as a real one does;
- a config's ``tensor-parallel-size`` t and ``data-parallel-size`` d (its layout, each 1 where
  not given) make a server of t x d GPUs: ``STAND_IN_SLOTS`` x t x d slots (each copy of the
  model d times, each with t GPUs' KV cache) and tokens t times faster (``STAND_IN_TOKEN_S`` /
  t). So its capacity per GPU grows with t and not with d: of layouts of one t, the smallest
  server carries as much per GPU. A model of nothing but those two facts;
- ``STAND_IN_STALL_AFTER``: in a server whose config sets no ``max-num-seqs`` (vLLM's defaults:
  the baseline), each stream stops after this many tokens and the connection is held open;
- ``STAND_IN_JIT_AT``: request numbers (``3,30``: the 3rd and the 30th to arrive) at which the
  server logs what vLLM 0.26's JIT monitor logs for a kernel compiled while serving, after the
  monitor's own line at start-up.

A server whose config names ``api-server-count`` or ``data-parallel-size`` is started as ``vllm
serve`` (``python -m tuner.engine.serve``): the fixture also installs this file as each of the
vLLM modules that module imports (``AS_MODULES``), whose names it defines here
(``ServeSubcommand`` runs ``main``).
"""

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import yaml

WORKER = """
import os, signal, sys, time
from pathlib import Path
pids = os.environ.get("STAND_IN_PIDS")
if pids:
    Path(pids, str(os.getpid())).write_text("worker")
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
while True:
    time.sleep(1)
"""


# The vLLM modules ``tuner.engine.serve`` imports, each installed as a copy of this file.
AS_MODULES = (
    "vllm/logger.py",
    "vllm/entrypoints/cli/serve.py",
    "vllm/entrypoints/serve/utils/api_utils.py",
    "vllm/utils/argparse_utils.py",
)
FlexibleArgumentParser = argparse.ArgumentParser


def cli_env_setup() -> None:
    """vLLM's environment set-up: nothing to set up here."""


class ServeSubcommand:
    """``vllm serve``: reads ``--config`` and runs this server."""

    def subparser_init(self, subparsers: argparse._SubParsersAction) -> None:
        subparsers.add_parser("serve").add_argument("--config")

    def validate(self, args: argparse.Namespace) -> None:
        pass

    def cmd(self, args: argparse.Namespace) -> None:
        main()


def main() -> None:
    config = yaml.safe_load(Path(sys.argv[sys.argv.index("--config") + 1]).read_text())
    token_s = float(os.environ.get("STAND_IN_TOKEN_S", "0.002"))
    stall_after = int(os.environ.get("STAND_IN_STALL_AFTER", "-1"))
    if "max-num-seqs" in config:
        stall_after = -1
    pids = os.environ.get("STAND_IN_PIDS")
    if pids:
        Path(pids, str(os.getpid())).write_text("server")
    gpus = os.environ.get("CUDA_VISIBLE_DEVICES")
    print(f"stand-in vLLM pid={os.getpid()} config={config} gpus={gpus}", flush=True)
    jit_at = {int(n) for n in os.environ.get("STAND_IN_JIT_AT", "").split(",") if n}
    if jit_at:
        print(f"(EngineCore pid={os.getpid()}) INFO 11-25 07:40:00 [jit_monitor.py:79] Kernel JIT "
              "monitor activated; monitored JIT compilations during inference will use "
              "mode=warn.", flush=True)  # fmt: skip
    worker = subprocess.Popen([sys.executable, "-c", WORKER])

    def stop(signum: int, frame: object) -> None:
        # Once: a second SIGTERM arriving inside worker.wait() re-entered it and deadlocked on
        # its lock (seen once in a full suite run: the server outlived a SIGKILLed tuner).
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        worker.terminate()
        try:
            worker.wait(timeout=5)
        except subprocess.TimeoutExpired:
            worker.kill()
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    done = {"n": 0, "arrived": 0}
    slots = int(os.environ.get("STAND_IN_SLOTS", "0"))
    tensor, data = (int(config.get(k, 1)) for k in ("tensor-parallel-size", "data-parallel-size"))
    slots, token_s = slots * tensor * data, token_s / tensor
    slot = threading.BoundedSemaphore(slots) if slots > 0 else contextlib.nullcontext()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def _send(self, code: int, body: bytes) -> None:
            self.send_response(code)
            self.send_header("content-type", "text/plain")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if self.path == "/health":
                self._send(200, b"")
            elif self.path == "/metrics":
                text = (
                    "# TYPE vllm:request_success_total counter\n"
                    f'vllm:request_success_total{{model_name="m"}} {done["n"]}\n'
                )
                self._send(200, text.encode())
            else:
                self._send(404, b"not found")

        def _chunk(self, data: bytes) -> None:
            line = b"data: " + data + b"\n\n"
            self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
            self.wfile.flush()

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["content-length"])))
            tokens = int(body["max_tokens"])
            done["arrived"] += 1
            if done["arrived"] in jit_at:
                print(f"(EngineCore pid={os.getpid()}) WARNING 11-25 07:40:01 [jit_monitor.py:132] "
                      f"Triton kernel JIT compilation during inference: _kernel_{done['arrived']}"
                      ". This causes a latency spike; consider extending warmup to cover this "
                      "shape/config.", flush=True)  # fmt: skip
            with slot:
                self._stream(body, tokens)
            done["n"] += 1

        def _stream(self, body: dict, tokens: int) -> None:
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            for i in range(tokens):
                if i == stall_after:
                    time.sleep(3600)  # a server that accepts and stops streaming
                time.sleep(token_s)
                choice = {"index": 0, "text": f" t{i}", "finish_reason": None}
                self._chunk(json.dumps({"choices": [choice]}).encode())
            usage = {"prompt_tokens": len(body["prompt"]), "completion_tokens": tokens}
            self._chunk(json.dumps({"choices": [], "usage": usage}).encode())
            self._chunk(b"[DONE]")
            self.wfile.write(b"0\r\n\r\n")

    server = ThreadingHTTPServer((config["host"], config["port"]), Handler)
    print("stand-in vLLM: startup complete", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
