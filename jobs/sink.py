"""The database Sink: what the trainer reports goes into the store, one transaction a step,
each write fenced by the attempt it belongs to (a write of an attempt that is over raises
StaleAttemptError, which ends the training).

A write that the database does not take now (SQLite locked by another process past its busy
timeout, a backup tool or a `sqlite3` shell holding a transaction; a PostgreSQL server
restarting) is tried again, with a warning in the run's log, for up to ESLAB_DB_WAIT_S
seconds (default 600): the run waits and goes on. Every write is one transaction that is
rolled back whole when it fails; a step whose commit went through although its answer was
lost with the connection is found in the database before the write is tried again, so a
retry neither loses nor doubles a step. Past the wait the run fails with an error that says
so.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable

from engine.sink import StepReport
from jobs.store.errors import DatabaseUnavailableError
from jobs.store.store import Store

WAIT_SETTING = "ESLAB_DB_WAIT_S"
DEFAULT_WAIT_S = 600.0
MAX_PAUSE_S = 30.0

log = logging.getLogger(__name__)


def database_wait_seconds() -> float:
    """ESLAB_DB_WAIT_S: how long a run waits for a database that does not take its writes."""
    raw = os.environ.get(WAIT_SETTING, "")
    try:
        return float(raw) if raw.strip() else DEFAULT_WAIT_S
    except ValueError:
        raise ValueError(f"{WAIT_SETTING} must be a number of seconds, got {raw!r}") from None


class DatabaseSink:
    def __init__(self, store: Store, run_id: int, attempt: int) -> None:
        self.store = store
        self.run_id = run_id
        self.attempt = attempt
        self.wait_s = database_wait_seconds()

    def log_step(self, report: StepReport) -> None:
        self._write(
            lambda: self.store.record_step(self.run_id, report, attempt=self.attempt),
            done=lambda: self.store.step_recorded(self.run_id, report),
        )

    def log_checkpoint(self, step: int, path: str) -> None:
        self._write(
            lambda: self.store.add_checkpoint(self.run_id, step, path, attempt=self.attempt)
        )

    def log_event(self, level: str, message: str) -> None:
        self._write(lambda: self.store.add_event(self.run_id, level, message, attempt=self.attempt))

    def heartbeat(self, step: int) -> None:
        self._write(lambda: self.store.heartbeat(self.run_id, step, attempt=self.attempt))

    def _write(self, write: Callable[[], None], done: Callable[[], bool] | None = None) -> None:
        """`write`, tried again while the database does not take it; `done` says whether an
        earlier try's commit went through after all."""
        deadline = time.monotonic() + self.wait_s
        pause = 1.0
        tried = False
        while True:
            try:
                if tried and done is not None and done():
                    return
                tried = True
                write()
                return
            except DatabaseUnavailableError as exc:
                if time.monotonic() + pause > deadline:
                    raise DatabaseUnavailableError(
                        f"{exc}; the run waited {self.wait_s:.0f} s ({WAIT_SETTING}) for the "
                        "database to take its writes and stops: is another process holding "
                        "it (a backup, an sqlite3 shell), or is the server down?"
                    ) from exc
                log.warning("run %s: %s; trying again in %.0f s", self.run_id, exc, pause)
                time.sleep(pause)
                pause = min(pause * 2, MAX_PAUSE_S)
