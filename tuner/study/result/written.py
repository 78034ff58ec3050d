"""The configuration a run writes: ``tuner.study.result.choice.choose``'s, rendered for ``vllm
serve --config`` (``tuner.study.result.emit``) and written whole, with what is said of it.

A file is written to a temporary file beside it and renamed over it, so a reader (``vllm serve
--config``, a second worker writing the same study's file) sees the old file or the new one,
never a part; a disk that fills leaves the old file as it was and no temporary one.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial

from tuner import build
from tuner.errors import TunerError
from tuner.study.measure import scoring
from tuner.study.measure.time_spent import time_lines
from tuner.study.plan.layouts import layout_of
from tuner.study.plan.spec import StudySpec
from tuner.study.result.choice import Choice, choose, summary
from tuner.study.result.emit import Provenance, render, serve_command
from tuner.study.result.words import words_of
from tuner.study.setup.objective import StudyObjective, of_study
from tuner.study.setup.prepare import Workload
from tuner.study.store.record import DEVICE, MEASURED_ON, VLLM_VERSION, TrialRecord
from tuner.study.trials import fingerprint, picks


@dataclass(frozen=True)
class Written:
    """A configuration written to ``path``: the ``choice`` it is (its outcome, why, and what it
    was held against), how the trial written met the SLOs (``verdict``), and what is said beside
    it: the end table's two columns (``labels``: what was written, and what beside it, whose
    figures, its ``TrialRecord.figures``, are ``other``), the objective's rows of that table,
    and the lines the file's header carries too (the objective's headline, the confirmation,
    where the time went)."""

    choice: Choice
    path: Path
    verdict: scoring.Verdict
    labels: tuple[str, str]
    other: Mapping[str, Any] | None
    rows: list[tuple[str, str, str]]
    lines: list[str]
    objective: StudyObjective
    workload: Workload
    # How to serve the file written: ``vllm serve``, or the user's app.
    serve: str = ""

    @property
    def trial(self) -> FrozenTrial:
        """The trial written: the chosen configuration's median measurement."""
        return self.choice.trial

    @property
    def figures(self) -> Mapping[str, Any]:
        """What the trial written measured (``TrialRecord.figures``)."""
        return TrialRecord.of(self.trial).figures

    def next_steps(self, spec_path: Path, capacity_command: str) -> list[str]:
        """What to try where nothing met the SLOs (``ValueWords.what_next``)."""
        return words_of(self.objective).what_next(
            self.trial, self.workload.replay.offered, spec_path, self.verdict.misses,
            capacity_command,
        )  # fmt: skip


def write_configuration(
    study: optuna.Study, spec: StudySpec, workload: Workload, path: Path
) -> Written | None:
    """Write the configuration ``choose`` picks for ``study`` to ``path``, and say what it is;
    None where no trial served (nothing written). A ``TunerError`` where the file cannot be
    written (the study keeps its trials)."""
    choice = choose(study)
    if choice is None:
        return None
    chosen = choice.trial
    figures = TrialRecord.of(chosen).figures
    verdict = scoring.verdict(picks.constraints_of(chosen), figures)
    beside = TrialRecord.of(choice.other.median_trial) if choice.other is not None else None
    other = beside.figures if beside is not None else None
    labels = _labels(choice)
    objective = of_study(study)
    peak = workload.replay.peak_req_per_s
    other_layout = layout_of(beside.engine_args) if beside is not None else None
    rows, lines, measured = words_of(objective).result_lines(
        chosen, other, peak, labels[1], other_layout
    )
    server = None if spec.server is None else spec.server.command
    lines += summary(choice, spec.vllm_defaults) + _time_spent(choice, spec.vllm_defaults)
    text = render(
        spec.model,
        picks.engine_args_of(chosen),
        _provenance(chosen, study.study_name, workload),
        verdict,
        figures,
        other,
        lines,
        measured,
        labels,
        server,
    )
    try:
        write_whole(path, text)
    except TunerError as exc:
        raise TunerError(
            f"{exc}; the study keeps every trial: --n-trials 0 writes the file again"
        ) from None
    serve = serve_command(str(path), server)
    return Written(choice, path, verdict, labels, other, rows, lines, objective, workload, serve)


def write_whole(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file renamed over it.

    A ``TunerError`` naming the file and the cause if that fails, with nothing left behind.
    """
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
        try:
            with os.fdopen(fd, "w") as handle:
                handle.write(text)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temporary, path)
        except BaseException:
            with contextlib.suppress(OSError):
                temporary.unlink()
            raise
    except OSError as exc:
        raise TunerError(
            f"cannot write {path}: {exc.strerror or exc}; it is left as it was"
        ) from None


def _labels(choice: Choice) -> tuple[str, str]:
    """The end table's and the header's two columns: what was written, and what beside it."""
    if choice.keeps_defaults:
        closest = choice.closest
        kept = TrialRecord.of(choice.group.first).baseline_label
        return kept, "n/a" if closest is None else f"trial {closest.number}"
    other = (
        "defaults"
        if choice.baseline is None
        else TrialRecord.of(choice.baseline.first).baseline_label
    )
    return ("best" if choice.meets_slos else "closest"), other


def _time_spent(choice: Choice, vllm_defaults: Mapping[str, Any]) -> list[str]:
    """Where the written trial's time went (``tuner.study.measure.time_spent``), vLLM's
    default max-num-seqs as the spec gives it (in ``vllm_defaults``)."""
    chosen = TrialRecord.of(choice.trial)
    return time_lines(
        chosen.number, chosen.figures, vllm_defaults, choice.keeps_defaults, chosen.engine_args
    )


def _provenance(chosen: FrozenTrial, name: str, workload: Workload) -> Provenance:
    """What the trial ran on; this machine's only for a trial recorded before tuner kept that."""
    said = TrialRecord.of(chosen).measured_on
    recorded = set(said) == set(MEASURED_ON)
    ran_on: Mapping[str, str] = said if recorded else fingerprint.measured_on()
    return Provenance(
        tuner_version=build.describe(),
        vllm_version=ran_on[VLLM_VERSION],
        device=ran_on[DEVICE],
        study=name,
        trace_path=str(workload.trace_path),
        trace_sha256=workload.trace_sha256,
        window=workload.replay.text,
        trial_number=chosen.number,
        machine_of_writer=not recorded,
    )
