"""``tuner report``: one HTML page of what a study found, or its outcome as JSON; and the line
``tuner run`` ends with."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tuner.cli.output import check_file_target
from tuner.cli.result_json import STDOUT, result_document, write_document
from tuner.report.build import write_report
from tuner.study.trials import search
from tuner.urls import shown_url


def default_storage(name: str) -> str:
    """Where ``tuner run`` keeps study NAME unless ``--storage`` says otherwise."""
    return f"sqlite:///studies/{name}.db"


def default_out(name: str) -> Path:
    """Where ``tuner report`` writes study NAME's page unless ``--out`` says otherwise."""
    return Path("reports") / name


def report_command(name: str, storage: str, configs: Path) -> str:
    """The ``tuner report`` command for a study, naming only what is not the default."""
    command = f"tuner report {name}"
    if storage != default_storage(name):
        command += f" --storage {shown_url(storage)}"
    if configs != Path("configs"):
        command += f" --configs {configs}"
    return command


def cmd_report(args: argparse.Namespace) -> int:
    """``tuner report``: write the study's HTML page (no network needed to open it), or with
    ``--json``, the outcome's JSON instead (``-``: on stdout, alone)."""
    storage = args.storage or default_storage(args.study)
    if args.json is not None:
        if args.json != STDOUT:
            check_file_target(Path(args.json), "--json")
        study = search.load_existing(args.study, storage)
        config_path = args.configs / f"{args.study}.yaml"
        write_document(result_document(study, storage, config_path), args.json, sys.stdout)
        if args.json != STDOUT:
            print(f"wrote {args.json}")
        return 0
    page = write_report(args.study, storage, args.out or default_out(args.study), args.configs)
    print(f"wrote {page} (open it in a browser; it needs no network)")
    return 0


def after_run(args: argparse.Namespace, name: str, storage: str, code: int) -> int:
    """``tuner run``'s last words: the report command, or the report itself with ``--report``."""
    if getattr(args, "report", False):
        page = write_report(name, storage, default_out(name), args.configs)
        print(f"report: {page}")
    else:
        print(f"report: {report_command(name, storage, args.configs)}")
    return code
