"""The engine arguments that the installed vLLM's server accepts, asked of vLLM itself.

A study spec naming an argument that vLLM does not have would fail every trial the same way;
``tuner run`` checks the names first. vLLM is imported in a child process
(``python -m tuner.engine.arguments``, about 8 s on two CPU cores), never in tuner's own, and
the answer is kept per vLLM version in ``$XDG_CACHE_HOME/tuner`` (else ``~/.cache/tuner``).
"""

from __future__ import annotations

import contextlib
import difflib
import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tuner.engine.environment import vllm_version

logger = logging.getLogger(__name__)


def server_parser() -> Any:
    """``vllm serve``'s argument parser, wherever this vLLM keeps it (imports vLLM)."""
    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:  # older releases
        from vllm.utils import FlexibleArgumentParser  # type: ignore[attr-defined,no-redef]
    for module in ("vllm.entrypoints.openai.cli_args", "vllm.entrypoints.launchers.cli_args"):
        try:
            make_arg_parser = __import__(module, fromlist=["make_arg_parser"]).make_arg_parser
        except (ImportError, AttributeError):
            continue
        return make_arg_parser(FlexibleArgumentParser())
    raise ImportError("this vLLM has no server argument parser tuner knows")


def cache_path(version: str) -> Path:
    """Where the argument names of vLLM ``version`` are kept once read (the user's cache)."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base, "tuner", f"vllm-{version}-arguments.json")


def known_arguments(
    python: str = sys.executable, timeout_s: float = 180.0
) -> frozenset[str] | None:
    """The server's long options, dashed and without ``--``; None when vLLM cannot say (not
    installed, a parser tuner does not know, too slow), and the check is then left to vLLM."""
    version = vllm_version()
    cached = cache_path(version)
    with contextlib.suppress(OSError, ValueError):
        return frozenset(json.loads(cached.read_text()))
    try:
        done = subprocess.run(
            [python, "-m", "tuner.engine.arguments"],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            stdin=subprocess.DEVNULL,
        )
        names = json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else None
    except (subprocess.TimeoutExpired, OSError, ValueError, IndexError):
        names = None
    if not isinstance(names, list):
        logger.warning("could not ask vLLM %s for its engine arguments; not checked", version)
        return None
    with contextlib.suppress(OSError):
        cached.parent.mkdir(parents=True, exist_ok=True)
        temporary = cached.with_suffix(f".{os.getpid()}.tmp")
        temporary.write_text(json.dumps(sorted(names)))
        temporary.replace(cached)
    return frozenset(names)


def unknown_arguments(names: Iterable[str], known: frozenset[str]) -> dict[str, list[str]]:
    """Each of ``names`` (dashed; a dotted field checked by its argument) that vLLM does not
    accept, with the known names closest to it."""
    unknown = {}
    for name in names:
        head = name.partition(".")[0]
        if head not in known:
            unknown[name] = difflib.get_close_matches(head, sorted(known), n=3)
    return unknown


def main() -> None:
    parser = server_parser()
    names = {
        option[2:]
        for action in parser._actions
        for option in action.option_strings
        if option.startswith("--")
    }
    # Last line of stdout: vLLM may print to stdout before it.
    sys.stdout.write("\n" + json.dumps(sorted(names)) + "\n")


if __name__ == "__main__":
    main()
