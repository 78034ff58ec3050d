"""What ``tuner run`` reads from its command line beside the spec: the spec's path, the lengths a
concurrency trace's requests take, the trace's digest, and the check that a study was measured
as this run would measure it."""

from __future__ import annotations

import argparse
import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tuner.errors import InputError
from tuner.study.trials.fingerprint import WORKLOAD_ATTR, differences
from tuner.traces.concurrency import LengthSource
from tuner.traces.formats import load_trace


def length_source(args: argparse.Namespace) -> LengthSource:
    """Where a closed-loop replay draws its request lengths from."""
    if args.lengths_trace:
        return LengthSource.from_trace(load_trace(args.lengths_trace))
    if args.input_lengths and args.output_lengths:
        return LengthSource.from_distributions(args.input_lengths, args.output_lengths)
    raise InputError(
        f"{args.trace} is a concurrency trace: give request lengths with --lengths-trace FILE "
        "or --input-lengths and --output-lengths (fixed:N, uniform:LO:HI, lognormal:MEDIAN:SIGMA)"
    )


def sha256_of(path: Path) -> str:
    """The file's SHA-256, hex: which trace a study and a written configuration came from."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def check_workload(study: Any, fingerprint: Mapping[str, Any]) -> None:
    """Refuse a study whose trials were measured or judged otherwise than ``fingerprint`` says.

    Compared on the keys both hold: the machine's (vLLM version, device) only when this run
    adds trials, and a study recorded before tuner checked the spec has only the trace and the
    window. Keys the study lacks are recorded now, and checked from then on; if the study has
    trials already, a line says which keys its earlier trials were not checked against.
    """
    recorded = study.user_attrs.get(WORKLOAD_ATTR)
    if recorded is None:
        study.set_user_attr(WORKLOAD_ATTR, dict(fingerprint))
        return
    differ = differences(recorded, fingerprint)
    if differ:
        raise InputError(
            f"study {study.study_name!r} was measured another way ({'; '.join(differ)}): its "
            "trials would not compare with new ones; use --study NEWNAME (or delete the DB) to "
            "start a new study"
        )
    missing = [key for key in fingerprint if key not in recorded]
    if not missing:
        return
    study.set_user_attr(WORKLOAD_ATTR, {**recorded, **fingerprint})
    if study.trials:
        print(
            f"study {study.study_name!r} predates tuner checking {', '.join(sorted(missing))}: "
            f"its {len(study.trials)} trials were not checked against them; recorded now"
        )


def spec_path(args: argparse.Namespace, name: str) -> Path:
    """The study's spec file: ``--spec``, else studies/NAME.yaml."""
    return args.spec or Path("studies") / f"{name}.yaml"
