"""The database Sink: what the trainer reports goes into the store, one transaction a step,
each write fenced by the attempt it belongs to (a write of an attempt that is over raises
StaleAttemptError, which ends the training)."""

from __future__ import annotations

from engine.sink import StepReport
from jobs.store.store import Store


class DatabaseSink:
    def __init__(self, store: Store, run_id: int, attempt: int) -> None:
        self.store = store
        self.run_id = run_id
        self.attempt = attempt

    def log_step(self, report: StepReport) -> None:
        self.store.record_step(self.run_id, report, attempt=self.attempt)

    def log_checkpoint(self, step: int, path: str) -> None:
        self.store.add_checkpoint(self.run_id, step, path, attempt=self.attempt)

    def log_event(self, level: str, message: str) -> None:
        self.store.add_event(self.run_id, level, message, attempt=self.attempt)

    def heartbeat(self, step: int) -> None:
        self.store.heartbeat(self.run_id, step, attempt=self.attempt)
