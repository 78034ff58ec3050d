"""The engine arguments and values that the installed vLLM's server accepts, asked of vLLM
itself.

A study spec naming an argument that vLLM does not have, or giving one a value its parser
refuses, would fail every trial the same way; ``tuner run`` checks the names and the values
first. vLLM is imported in a child process (``python -m tuner.engine.arguments``, about 8 s on
two CPU cores), never in tuner's own: the names are read from ``vllm serve``'s parser, and each
value goes through that parser as the trial's ``--config`` file gives it (``config_yaml``). The
names, and the values the parser took, are kept per vLLM version in ``$XDG_CACHE_HOME/tuner``
(else ``~/.cache/tuner``), so only values not seen before cost a child process.
"""

from __future__ import annotations

import contextlib
import difflib
import json
import logging
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NoReturn

from tuner.engine.environment import vllm_version
from tuner.flags import config_yaml

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


def cache_path(version: str, kind: str = "arguments") -> Path:
    """Where the argument names (``kind`` "arguments") or the values accepted ("values") of vLLM
    ``version`` are kept once read (the user's cache)."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base, "tuner", f"vllm-{version}-{kind}.json")


def _ask_vllm(mode: str, asked: Any, python: str, timeout_s: float) -> Any:
    """The last line of ``python -m tuner.engine.arguments MODE`` (``asked`` on its stdin, as
    JSON), read as JSON; None when the child cannot say."""
    try:
        done = subprocess.run(
            [python, "-m", "tuner.engine.arguments", mode],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            input=json.dumps(asked),
        )
        return json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else None
    except (subprocess.TimeoutExpired, OSError, ValueError, IndexError):
        return None


def _keep(cached: Path, content: Any) -> None:
    """Write ``content`` as JSON at ``cached``, whole (a temporary file renamed over it)."""
    with contextlib.suppress(OSError):
        cached.parent.mkdir(parents=True, exist_ok=True)
        temporary = cached.with_suffix(f".{os.getpid()}.tmp")
        temporary.write_text(json.dumps(content))
        temporary.replace(cached)


def known_arguments(
    python: str = sys.executable, timeout_s: float = 180.0
) -> frozenset[str] | None:
    """The server's long options, dashed and without ``--``; None when vLLM cannot say (not
    installed, a parser tuner does not know, too slow), and the check is then left to vLLM."""
    version = vllm_version()
    cached = cache_path(version)
    with contextlib.suppress(OSError, ValueError):
        return frozenset(json.loads(cached.read_text()))
    names = _ask_vllm("names", None, python, timeout_s)
    if not isinstance(names, list):
        logger.warning("could not ask vLLM %s for its engine arguments; not checked", version)
        return None
    _keep(cached, sorted(names))
    return frozenset(names)


def refused_values(
    values: Iterable[tuple[str, Any]], python: str = sys.executable, timeout_s: float = 180.0
) -> dict[int, str] | None:
    """Which of ``values`` (pairs of a dashed argument name and one value, as a spec gives
    them) vLLM's server parser refuses, by their index, with its message; None when vLLM cannot
    say (the check is then left to vLLM). Pairs accepted before are not asked again."""
    version = vllm_version()
    cached = cache_path(version, "values")
    accepted: set[str] = set()
    with contextlib.suppress(OSError, ValueError, TypeError):
        accepted = set(json.loads(cached.read_text()))
    keys = [json.dumps(pair, sort_keys=True, default=str) for pair in values]
    asked = {i: key for i, key in enumerate(keys) if key not in accepted}
    if not asked:
        return {}
    answer = _ask_vllm("values", [json.loads(k) for k in asked.values()], python, timeout_s)
    if not isinstance(answer, list) or len(answer) != len(asked):
        logger.warning("could not ask vLLM %s to check engine argument values", version)
        return None
    refused = {i: str(said) for i, said in zip(asked, answer, strict=True) if said is not None}
    _keep(cached, sorted(accepted | {k for i, k in asked.items() if i not in refused}))
    return refused


def unknown_arguments(names: Iterable[str], known: frozenset[str]) -> dict[str, list[str]]:
    """Each of ``names`` (dashed; a dotted field checked by its argument) that vLLM does not
    accept, with the known names closest to it."""
    unknown = {}
    for name in names:
        head = name.partition(".")[0]
        if head not in known:
            unknown[name] = difflib.get_close_matches(head, sorted(known), n=3)
    return unknown


class _Refused(Exception):
    """What the parser said where it would have exited."""


def _refuse(message: str) -> NoReturn:
    raise _Refused(message)


def _parse_one(parser: Any, name: str, value: Any) -> str | None:
    """None where ``parser`` takes ``name: value`` as a trial's ``--config`` file gives it,
    else what it said."""
    with tempfile.TemporaryDirectory() as folder:
        config = Path(folder, "engine.yaml")
        config.write_text(config_yaml({name: value}))
        try:
            parser.parse_args(["--config", str(config)])
        except (_Refused, ValueError, TypeError) as exc:
            return " ".join(str(exc).split()) or type(exc).__name__
    return None


def main() -> None:
    """``names``: the server's long options; ``values``: for each ``[name, value]`` on stdin,
    None or the parser's refusal. The answer is stdout's last line (vLLM may print before)."""
    parser = server_parser()
    if sys.argv[1:] == ["values"]:
        parser.error = _refuse  # the parser's message instead of its usage and exit
        with contextlib.redirect_stdout(sys.stderr):
            answer: Any = [_parse_one(parser, name, value) for name, value in json.load(sys.stdin)]
    else:
        answer = sorted(
            option[2:]
            for action in parser._actions
            for option in action.option_strings
            if option.startswith("--")
        )
    sys.stdout.write("\n" + json.dumps(answer) + "\n")


if __name__ == "__main__":
    main()
