"""How a run ended, recorded once: succeeded, failed with its traceback, or cancelled with
where `eslab resume` continues from. Queued runs (the Ray job's jobs.worker) and foreground
ones (`eslab train`, jobs.runner) end through the same Worker, and so through here. The
outcome belongs to one attempt: an attempt that is over (the run was resumed since) records
nothing."""

from __future__ import annotations

import logging
import sys
import threading
import traceback
from pathlib import Path

from jobs.checkpoints import latest_checkpoint
from jobs.store.errors import StaleAttemptError
from jobs.store.status import RunStatus
from jobs.store.store import Store

log = logging.getLogger("jobs.worker")

LOG_TAIL = "the end of its log:"
"""Where an error that the scheduler records (the worker died or fell silent) turns to the
tail of the worker's log: the dashboard shows the reason first and the tail on demand."""


def with_log_tail(reason: str, tail: str) -> str:
    """A run's error: why the scheduler ended it, then its worker's last log lines."""
    return f"{reason}; {LOG_TAIL}\n{tail}"


class RunOutcome:
    """The outcome of one attempt of a run. The first one recorded stands, whether it comes
    from the main thread (training ended) or from the stop watchdog (a step abandoned); the
    lock keeps the two from recording at once."""

    def __init__(self, store: Store, run_id: int, attempt: int) -> None:
        self.store = store
        self.run_id = run_id
        self.attempt = attempt
        self._lock = threading.Lock()
        self._deciding = False

    def record(self, status: RunStatus, message: str, error: str | None = None) -> bool:
        """Record the outcome unless the run has one (or cannot take this one), with
        `message` as its last event; True when recorded."""
        with self._lock:
            self._deciding = True
            try:
                if self.store.finish_run(
                    self.run_id, status, error=error, event=message, attempt=self.attempt
                ):
                    log.info("run %s %s: %s", self.run_id, status.value, message.splitlines()[0])
                    return True
            except StaleAttemptError as exc:
                log.error("%s; not recording %s", exc, status.value)
                return False
            now = self.store.get_run(self.run_id).status.value
            log.warning("run %s is %s; not recording %s", self.run_id, now, status.value)
            return False

    def deciding(self) -> bool:
        """Whether this worker is recording, or has recorded, its outcome: from then on the
        run ending is its own doing, not a sign that its attempt was ended elsewhere. Waits
        for a recording in progress."""
        with self._lock:
            return self._deciding

    def succeeded(self, output: Path) -> None:
        # A cancel that came as the last step ended leaves the run cancelling, which may
        # only end cancelled (the final model is saved all the same).
        if not self.record(RunStatus.SUCCEEDED, f"succeeded; final model in {output}"):
            self.record(
                RunStatus.CANCELLED,
                f"the cancel came as the last step ended; final model in {output}",
            )

    def failed(self, exc: BaseException, message: str) -> None:
        """Failed with the traceback, which also goes to stderr (the Ray job's log)."""
        error = format_traceback(exc)
        print(error, file=sys.stderr, flush=True)
        self.record(RunStatus.FAILED, message, error=error)

    def cancelled(self, why: str) -> None:
        self.record(RunStatus.CANCELLED, f"{why}; {self.resume_hint()}")

    def resume_hint(self) -> str:
        checkpoint = latest_checkpoint(self.store, self.run_id)
        where = f"the checkpoint of step {checkpoint.step}" if checkpoint else "the start"
        return f"`eslab resume` continues from {where}"


def format_traceback(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc))
