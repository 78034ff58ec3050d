"""Which tuner process runs a trial, and the trials of processes that are gone.

Each trial records its worker: the machine (host name and boot), the process id and the
process's start time, which together name one process for as long as the machine runs. A
trial left RUNNING by a worker that no longer exists on this machine (tuner was killed with
SIGKILL, the machine rebooted) is marked FAIL with the reason when a run opens the study, so
that rerunning the same command resumes it. A RUNNING trial of a live worker, or of another
machine (which cannot be looked at from here), is left alone.
"""

from __future__ import annotations

import logging
import os
import socket
from functools import cache
from pathlib import Path

import optuna
from optuna.trial import FrozenTrial, TrialState

from tuner.study.measure import record
from tuner.study.measure.record import TrialRecord

logger = logging.getLogger(__name__)


def _read(path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return ""


@cache
def _machine() -> str:
    return f"{socket.gethostname()}/{_read('/proc/sys/kernel/random/boot_id')}"


def _started(pid: int) -> str:
    """The process's start time in clock ticks since boot ("" where /proc cannot say)."""
    stat = _read(f"/proc/{pid}/stat")
    fields = stat.rpartition(")")[2].split()
    return fields[19] if len(fields) > 19 else ""


def this_worker() -> str:
    """``HOST/BOOT PID STARTED``: this process, as recorded on the trials it runs."""
    return f"{_machine()} {os.getpid()} {_started(os.getpid())}"


def is_gone(worker: str) -> bool:
    """Whether the worker is known to have ended: on this machine, and not running now."""
    machine, _, rest = worker.partition(" ")
    host, _, boot = machine.partition("/")
    this_host, _, this_boot = _machine().partition("/")
    if host != this_host:
        return False
    if boot != this_boot:
        return True  # the machine rebooted since
    pid, _, started = rest.partition(" ")
    return not pid.isdigit() or _started(int(pid)) != started


def fail_orphans(study: optuna.Study) -> list[FrozenTrial]:
    """Mark FAIL, with the reason, every RUNNING trial whose worker is gone; return them.

    Workers that open the study together find the same orphans: one that another worker
    finished first is left to it, and not returned.
    """
    orphans = [
        (t, worker)
        for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        if (worker := TrialRecord.of(t).worker) is not None and is_gone(worker)
    ]
    marked = []
    for frozen, worker in orphans:
        _, pid, _ = worker.split(" ", 2)
        reason = (
            f"tuner (pid {pid}) ended while this trial ran, killed or crashed: "
            "nothing it measured was kept"
        )
        try:
            record.give_reason(optuna.trial.Trial(study, frozen._trial_id), reason)
            study.tell(frozen.number, state=TrialState.FAIL)
        except (optuna.exceptions.UpdateFinishedTrialError, ValueError):
            # Optuna's storage refuses to update a finished trial, and ``tell`` a trial it
            # reads as finished (ValueError); anything else is not another worker's doing.
            if not _finished(study, frozen.number):
                raise
            continue
        logger.warning("trial %d: %s; marked FAIL", frozen.number, reason)
        marked.append(frozen)
    return marked


def _finished(study: optuna.Study, number: int) -> bool:
    return any(t.number == number and t.state.is_finished() for t in study.get_trials())
