"""The ``tuner`` command line: builds the study from its inputs and reports what it found.

Only this package prints and chooses exit codes (``tuner.cli.exits``). ``tuner run`` exits 0
when it wrote a configuration that meets the SLOs, 3 when it wrote the one that came closest but
misses them, 1 when no trial served the window (nothing written) or the tool failed, 2 on bad
input or usage, 130 when interrupted. The other commands exit 0, 1 or 2 alike.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from collections.abc import Sequence

from tuner.cli.compile_key import cmd_compile_key
from tuner.cli.exits import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_INTERRUPTED
from tuner.cli.interrupts import deliver_lost_interrupts, raise_interrupt
from tuner.cli.parser import build_parser
from tuner.cli.report import cmd_report
from tuner.cli.run import cmd_run
from tuner.cli.server_url import cmd_server_url
from tuner.cli.spec import cmd_init
from tuner.cli.trace import cmd_trace_from_prometheus, cmd_trace_inspect
from tuner.errors import InputError, TunerError
from tuner.urls import shown_text


def main(argv: Sequence[str] | None = None) -> int:
    """``tuner``: parse the command line, run the command, and turn tuner's errors into a line on
    stderr and an exit status."""
    args = build_parser().parse_args(argv)
    # As given: ``tuner run --gpus`` starts its workers with the same arguments.
    args.argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)
    signal.signal(signal.SIGTERM, raise_interrupt)
    deliver_lost_interrupts()
    try:
        if args.command == "trace":
            if args.trace_command == "inspect":
                return cmd_trace_inspect(args)
            return cmd_trace_from_prometheus(args)
        if args.command == "compile-key":
            return cmd_compile_key(args)
        if args.command == "report":
            return cmd_report(args)
        if args.command == "init":
            return cmd_init(args)
        if args.server_url is not None:
            return cmd_server_url(args)
        return cmd_run(args)
    except InputError as exc:
        print(f"tuner: {shown_text(str(exc), _urls(args))}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except TunerError as exc:
        print(f"tuner: {shown_text(str(exc), _urls(args))}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print("\ntuner: interrupted; the study keeps its finished trials", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return _output_closed()
    except Exception as exc:
        _hide_secrets(exc, _urls(args))
        raise


# The options that take a URL, which may hold a password.
URL_OPTIONS = ("storage", "url", "server_url")


def _urls(args: argparse.Namespace) -> list[str]:
    """The URLs given on the command line."""
    return [url for name in URL_OPTIONS if isinstance(url := getattr(args, name, None), str)]


def _hide_secrets(exc: BaseException, urls: list[str]) -> None:
    """``exc``, and the exceptions it was raised from, with the passwords of ``urls`` hidden in
    their arguments: an error tuner did not expect (a traceback) names no password either."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        each = todo.pop()
        if each is None or id(each) in seen:
            continue
        seen.add(id(each))
        each.args = tuple(shown_text(a, urls) if isinstance(a, str) else a for a in each.args)
        todo += [each.__cause__, each.__context__]


def _output_closed() -> int:
    """What a command whose output was closed (``tuner ... | head``) says: a line, exit 1.

    Standard output is pointed at /dev/null, so that flushing it at exit cannot fail again.
    """
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    print("tuner: the output was closed before it ended (broken pipe)", file=sys.stderr)
    return EXIT_FAILED
