"""Which tuner process runs a trial, and the trials of processes that are gone.

Each trial records its worker: the machine (host name and boot), the process id and the
process's start time, which together name one process for as long as the machine runs. A
trial left RUNNING by a worker that no longer exists on this machine (tuner was killed with
SIGKILL, the machine rebooted) is marked FAIL with the reason when a run opens the study, so
that rerunning the same command resumes it. A RUNNING trial of another machine, which cannot be
looked at from here, is failed once its lease runs out (``tuner.study.trials.lease``); one of a
live worker is left alone.

The host is the machine's name, or ``TUNER_WORKER_HOST`` where set: for containers whose host
names repeat (each pod of a Job its own name, but a restarted one the same), and for tests, which
make one machine's processes two hosts.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable
from functools import cache
from pathlib import Path

import optuna
from optuna.trial import FrozenTrial, TrialState

from tuner.engine import environment
from tuner.study.store import record
from tuner.study.store.record import Placement, TrialRecord
from tuner.study.trials import lease

logger = logging.getLogger(__name__)

# The environment variable that names this worker's host in place of the machine's name.
HOST_ENV = "TUNER_WORKER_HOST"


def _read(path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return ""


def host() -> str:
    """This worker's host: ``TUNER_WORKER_HOST``, else the machine's name."""
    return os.environ.get(HOST_ENV) or socket.gethostname()


@cache
def _machine() -> str:
    return f"{host()}/{_read('/proc/sys/kernel/random/boot_id')}"


@cache
def this_placement() -> Placement:
    """The host and the GPUs this process's servers see (``CUDA_VISIBLE_DEVICES``, through
    nvidia-smi, asked once a process)."""
    gpus = environment.visible_gpus()
    return Placement(host(), tuple(g.index for g in gpus), tuple(g.uuid for g in gpus))


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


def fail_orphans(study: optuna.Study, now: float | None = None) -> list[FrozenTrial]:
    """Mark FAIL, with the reason, every RUNNING trial whose worker is gone (on this machine)
    or whose lease ran out before ``now`` (Unix seconds; by default the clock's); return them.

    Workers that open the study together find the same orphans: one that another worker
    finished first is left to it, and not returned.
    """
    return _fail(study, lambda recorded: _why_orphaned(recorded, now))


def fail_expired(study: optuna.Study, now: float | None = None) -> list[FrozenTrial]:
    """Mark FAIL, with the reason, every RUNNING trial whose lease ran out before ``now``;
    return them (what a worker does as it finishes a trial: a trial of a dead worker of this
    machine with a lease still running waits for its lease, or for a run to open the study)."""
    return _fail(study, lambda recorded: lease.expired(recorded, now))


def _fail(study: optuna.Study, why: Callable[[TrialRecord], str | None]) -> list[FrozenTrial]:
    """Mark FAIL every RUNNING trial ``why`` gives a reason for, with it; return them."""
    marked = []
    for frozen in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        reason = why(TrialRecord.of(frozen))
        if reason is None:
            continue
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


def _why_orphaned(recorded: TrialRecord, now: float | None) -> str | None:
    """Why a RUNNING trial is known to be left by its worker; None where it is not."""
    worker = recorded.worker
    if worker is not None and is_gone(worker):
        _, pid, _ = worker.split(" ", 2)
        return (
            f"tuner (pid {pid}) ended while this trial ran, killed or crashed: "
            "nothing it measured was kept"
        )
    return lease.expired(recorded, now)


def _finished(study: optuna.Study, number: int) -> bool:
    return any(t.number == number and t.state.is_finished() for t in study.get_trials())
