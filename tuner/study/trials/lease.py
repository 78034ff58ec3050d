"""A trial's lease: how workers on other hosts know that a RUNNING trial was left.

A worker that dies on another host cannot be looked at from here (``tuner.study.trials.workers``
looks up processes of this machine only). So while a worker measures a trial, a thread of its
own writes the trial's ``lease_until`` (``tuner.study.store.record.leased``: now plus the
spec's ``lease_s``), again every third of ``lease_s``. A RUNNING trial whose lease is past is
one no worker renews: killed, crashed, its host down or cut off from the storage. Any worker
that opens the study or finishes a trial fails it, with the reason
(``tuner.study.trials.workers.fail_orphans``).

Leases are read against the reading worker's clock: hosts whose clocks differ by more than a
small part of ``lease_s`` (NTP keeps them within milliseconds) would misjudge them.

Optuna has a heartbeat of its own, but only for trials run by ``Study.optimize``; tuner asks and
tells trials itself.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from types import TracebackType

import optuna

from tuner.study.store import record
from tuner.study.store.record import TrialRecord
from tuner.study.store.storage import STORAGE_ERRORS, cause

logger = logging.getLogger(__name__)

# Seconds a lease lasts unless the spec says (``lease_s``); renewed every third of it.
LEASE_S = 120.0
RENEWALS_PER_LEASE = 3


class Lease:
    """Holds ``trial``'s lease while the ``with`` block runs: written on entry, renewed every
    ``lease_s / 3`` seconds by a daemon thread, which stops (and is joined) on exit.

    A renewal that fails (the storage down a while, the trial failed by another worker whose
    clock ran ahead) is logged and tried again at the next turn; ``lost`` says whether the
    trial was found finished, which the caller then leaves as it is. ``clock`` gives Unix
    seconds (a test's own).
    """

    def __init__(
        self,
        study: optuna.Study,
        trial: optuna.Trial,
        lease_s: float = LEASE_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.lease_s = lease_s
        self.lost = False
        self._clock = clock
        self._study = study
        self._trial_id = trial._trial_id
        self._number = trial.number
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._renew, name=f"lease-{trial.number}", daemon=True
        )
        self._writer: record.Writable = trial

    def __enter__(self) -> Lease:
        record.leased(self._writer, self._clock() + self.lease_s)
        # The thread writes through a trial object of its own: the caller's keeps a cache.
        self._writer = optuna.trial.Trial(self._study, self._trial_id)
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join()

    def _renew(self) -> None:
        while not self._stop.wait(self.lease_s / RENEWALS_PER_LEASE):
            try:
                record.leased(self._writer, self._clock() + self.lease_s)
            except optuna.exceptions.UpdateFinishedTrialError:
                self.lost = True
                logger.warning("trial %d was ended by another worker: lease lost", self._number)
                return
            except STORAGE_ERRORS as exc:
                logger.warning("trial %d: renewing its lease failed: %s", self._number, cause(exc))


def expired(recorded: TrialRecord, now: float | None = None) -> str | None:
    """Why a RUNNING trial's lease tells that its worker left it: its lease is past at ``now``
    (Unix seconds; by default the clock's); None where it holds a lease still, or none."""
    until = recorded.lease_until
    if until is None or until >= (time.time() if now is None else now):
        return None
    when = datetime.fromtimestamp(until, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    worker = recorded.worker or "a worker"
    host, _, rest = worker.partition(" ")
    pid = rest.partition(" ")[0]
    who = f"tuner (pid {pid}) on {host.partition('/')[0]}" if pid else worker
    return (
        f"{who} stopped renewing this trial's lease, which ran out at {when} (killed, "
        "crashed, or its host down or cut off from the storage): nothing it measured was kept"
    )
