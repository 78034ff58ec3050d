"""Two ways a test or a benchmark starts the stand-in server (``tuner.testing.standin``): in a
process of its own at a port (``start``), or installed as vLLM's ``api_server`` module, for
``tuner run`` to start in place of vLLM (``install_as_vllm``)."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import httpx

MODULE = "tuner.testing.standin"


@dataclass
class Started:
    """A stand-in running in a process of its own: the URL it serves at, and the one it answers
    ``/stats`` at for its own requests (the same but where it shares its port with others)."""

    process: subprocess.Popen[bytes]
    url: str
    stats_url: str

    def stats(self) -> dict[str, list[float]]:
        """What it recorded since it was last asked, then forgot: for each request, by its body's
        key (``body_key``), when its body arrived and when its first event was written,
        ``time.monotonic()`` seconds."""
        return dict(httpx.get(self.stats_url + "/stats", timeout=30).json())

    def stop(self) -> None:
        """Stop it (SIGTERM), wait until it has exited and close its pipe."""
        with self.process:  # closes its stdout after the wait
            self.process.terminate()

    def __enter__(self) -> Started:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


def start(
    port: int = 0,
    *,
    ttft_ms: float = 20.0,
    itl_ms: float = 10.0,
    cpu: int | None = None,
    shared: bool = False,
) -> Started:
    """A stand-in in a process of its own, once it listens on 127.0.0.1:``port`` (0: a free
    port): its first token ``ttft_ms`` after a request's body, then one every ``itl_ms``;
    pinned to ``cpu`` where given; ``shared``: the port shared with other stand-ins (each
    answers ``/stats`` on a port of its own). ``RuntimeError`` where it did not start."""
    command = [sys.executable, "-m", MODULE, "--port", str(port)]
    command += ["--ttft-ms", str(ttft_ms), "--itl-ms", str(itl_ms)]
    command += (["--cpu", str(cpu)] if cpu is not None else []) + (["--shared"] if shared else [])
    process = subprocess.Popen(command, stdout=subprocess.PIPE)
    assert process.stdout is not None
    line = process.stdout.readline().split()
    if not line or line[0] != b"ready":
        with process:
            process.kill()
        raise RuntimeError(f"the stand-in server did not start: {shlex.join(command)}")
    ports = [int(word) for word in line[1:]]
    return Started(process, f"http://127.0.0.1:{ports[0]}", f"http://127.0.0.1:{ports[-1]}")


# vLLM's api_server module, standing in: what ``python -m vllm.entrypoints.openai.api_server``
# and the zygote (which imports the module, then runs it as ``__main__`` in each fork) run.
API_SERVER = f'''"""vLLM's OpenAI server, stood in for by {MODULE}."""
import sys

from {MODULE} import main

if __name__ == "__main__":
    sys.exit(main())
'''


# The vLLM modules ``vllm serve`` (``tuner.engine.serve``) imports, and what each holds here:
# the stand-in's own name it imports there (none: an empty module).
AS_SERVE = {
    "vllm/logger.py": "",  # vLLM 0.26's: no logging set-up from the arguments
    "vllm/entrypoints/cli/serve.py": "ServeSubcommand",
    "vllm/entrypoints/serve/utils/api_utils.py": "cli_env_setup",
    "vllm/utils/argparse_utils.py": "FlexibleArgumentParser",
}


def install_as_vllm(root: Path) -> dict[str, str]:
    """Write a ``vllm`` package under ``root`` holding only
    ``vllm.entrypoints.openai.api_server``, which runs the stand-in (``--config FILE``: vLLM's
    shape, ``tuner.testing.standin.serve_as_vllm``), and the modules ``vllm serve`` imports
    (``AS_SERVE``: for a config that names ``api-server-count`` or ``data-parallel-size``).
    Return the environment, over this process's, under which ``tuner run``, unchanged, starts
    it in place of vLLM with either launcher: ``PYTHONPATH`` with ``root`` first (tuner itself
    imports no vLLM to run a study). The server imports tuner: it must be importable there as
    it is here."""
    package = root / "vllm" / "entrypoints" / "openai"
    package.mkdir(parents=True, exist_ok=True)
    for folder in (root / "vllm", root / "vllm" / "entrypoints", package):
        (folder / "__init__.py").write_text("")
    (package / "api_server.py").write_text(API_SERVER)
    for module, name in AS_SERVE.items():
        for folder in Path(module).parents[:-1]:
            (root / folder).mkdir(parents=True, exist_ok=True)
            (root / folder / "__init__.py").touch()
        (root / module).write_text(f"from {MODULE} import {name}  # noqa: F401\n" if name else "")
    path = [str(root), os.environ.get("PYTHONPATH", "")]
    return {"PYTHONPATH": os.pathsep.join(p for p in path if p)}
