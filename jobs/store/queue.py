"""The queue and a run's life under racing writers: what the scheduler, the worker and the CLI
need to hand queued runs to Ray, start, beat, finish, cancel and resume them.

Every status change here is a conditional UPDATE (`... WHERE status IN (...)`, see
fence.compare_and_set) so that two writers racing, such as a cancel and a worker starting, or
a worker finishing and the scheduler declaring it dead, cannot both win, on SQLite as on
PostgreSQL. The worker's writes (start, beat, finish) also name its attempt, so that a
worker of an attempt that is over cannot start, keep alive or end its successor."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select

from jobs.store import models
from jobs.store.errors import InvalidTransitionError, StoreError
from jobs.store.fence import compare_and_set, stale_attempt, write_as
from jobs.store.records import RunRecord
from jobs.store.rows import database_now, event_row, find_run, run_record, utcnow
from jobs.store.session import StoreBase
from jobs.store.status import RunStatus, can_transition
from jobs.store.steps import forget_steps_after


class RunQueue(StoreBase):
    def queued_runs(self, *, limit: int = 100) -> list[RunRecord]:
        """Queued runs not yet handed to Ray, oldest first: the queue is first in, first out."""
        with self._session() as s:
            rows = s.scalars(
                select(models.Run)
                .where(
                    models.Run.status == RunStatus.QUEUED.value,
                    models.Run.ray_submission_id.is_(None),
                )
                .order_by(models.Run.created_at, models.Run.id)
                .limit(limit)
            )
            return [run_record(r) for r in rows]

    def active_runs(self) -> list[RunRecord]:
        """Runs that hold a Ray job or are about to: submitted but not yet started by their
        worker (queued with a submission id), running, and cancelling."""
        run = models.Run
        with self._session() as s:
            rows = s.scalars(
                select(run)
                .where(
                    run.status.in_([RunStatus.RUNNING.value, RunStatus.CANCELLING.value])
                    | ((run.status == RunStatus.QUEUED.value) & run.ray_submission_id.is_not(None))
                )
                .order_by(run.created_at, run.id)
            )
            return [run_record(r) for r in rows]

    def mark_submitted(self, run: int | str, submission_id: str) -> bool:
        """Note the Ray submission id *before* submitting, so that a crash between the two
        leaves a trace the next tick can check with Ray. False when the run is no longer
        queued (cancelled meanwhile) or was already submitted."""
        with self._session() as s:
            row = find_run(s, run)
            return compare_and_set(
                s,
                row.id,
                [RunStatus.QUEUED],
                {"ray_submission_id": submission_id},
                extra=models.Run.ray_submission_id.is_(None),
            )

    def clear_submission(self, run: int | str) -> None:
        """Undo mark_submitted when Ray could not take the job, so the next tick retries."""
        with self._session() as s:
            row = find_run(s, run)
            compare_and_set(s, row.id, [RunStatus.QUEUED], {"ray_submission_id": None})

    def start_run(
        self, run: int | str, *, attempt: int | None = None, event: str | None = None
    ) -> bool:
        """queued -> running, as the worker of `attempt` starts, with `event` as the
        running run's first event in the same transaction (the phase it starts in: no
        reader sees it running with no phase first); False when the run was cancelled
        first, or is no longer at that attempt (a Ray job of an attempt that was cancelled
        while queued and then resumed, started late)."""
        with self._session() as s:
            row = find_run(s, run)
            now = database_now()  # what the scheduler compares heartbeats against
            started = compare_and_set(
                s,
                row.id,
                [RunStatus.QUEUED],
                {
                    "status": RunStatus.RUNNING.value,
                    "heartbeat_at": now,
                    "started_at": func.coalesce(models.Run.started_at, now),
                },
                extra=None if attempt is None else models.Run.attempt == attempt,
            )
            if started and event is not None:
                s.add(event_row(row.id, "info", event))
            return started

    def finish_run(
        self,
        run: int | str,
        status: RunStatus,
        *,
        error: str | None = None,
        event: str | None = None,
        attempt: int | None = None,
    ) -> bool:
        """End a run that has not ended yet, with `event` as its last event (an error
        event for a failure) in the same transaction. False when it had already ended (a
        late write of a dying worker, or the scheduler and the worker both noticing the
        end): the first outcome recorded is the one that stays. With `attempt`, a run that
        was resumed as another attempt since is not touched: StaleAttemptError."""
        if not status.is_terminal():
            raise ValueError(f"finish_run needs a terminal status, got {status.value}")
        sources = [x for x in RunStatus if not x.is_terminal() and can_transition(x, status)]
        values: dict[str, Any] = {"status": status.value, "finished_at": utcnow()}
        if error is not None:
            values["error"] = error
        with self._session() as s:
            row = find_run(s, run)
            fence = None if attempt is None else models.Run.attempt == attempt
            if not compare_and_set(s, row.id, sources, values, extra=fence):
                current = s.scalar(select(models.Run.attempt).where(models.Run.id == row.id))
                if attempt is not None and current != attempt:
                    raise stale_attempt(s, row.id, attempt)
                return False
            if event is not None:
                level = "error" if status is RunStatus.FAILED else "info"
                s.add(event_row(row.id, level, event))
            return True

    def beat(self, run: int | str, *, attempt: int | None = None) -> RunStatus:
        """The worker's background heartbeat: proves the process lives even while one step
        takes minutes, and tells it the run's status (a cancel request shows here). Fenced
        like every write of an attempt (fence.write_as): a worker whose attempt is over
        hears it here, within one heartbeat, even in the middle of a long step."""
        with self._session() as s:
            run_id = write_as(s, run, attempt, heartbeat_at=database_now())
            return RunStatus(s.scalar(select(models.Run.status).where(models.Run.id == run_id)))

    def request_cancel(self, run: int | str, *, reason: str | None = None) -> RunRecord:
        """A queued run is cancelled at once (its worker, if Ray started one, sees that and
        exits); a running one becomes cancelling until its worker stops. `reason`, when
        given, is recorded as an event of its own in the cancel's transaction (a sweep
        stopping a run early says why)."""
        for _ in range(5):  # each retry follows a concurrent status change
            with self._session() as s:
                row = find_run(s, run)
                status = RunStatus(row.status)
                if status is RunStatus.CANCELLING:
                    return run_record(row)
                if status.is_terminal():
                    raise InvalidTransitionError(
                        f"run {row.id} already {status.value}; there is nothing to cancel"
                    )
                target = RunStatus.CANCELLED if status is RunStatus.QUEUED else RunStatus.CANCELLING
                values: dict[str, Any] = {"status": target.value}
                if target is RunStatus.CANCELLED:
                    values["finished_at"] = utcnow()
                if compare_and_set(s, row.id, [status], values):
                    if reason is not None:
                        s.add(event_row(row.id, "info", reason))
                    s.add(
                        event_row(
                            row.id, "info", f"cancel requested ({status.value} -> {target.value})"
                        )
                    )
                    s.flush()
                    s.refresh(row)
                    return run_record(row)
        raise StoreError(f"run {run} kept changing status while being cancelled; try again")

    def resume_run(self, run: int | str, step: int) -> RunRecord:
        """Queue a failed or cancelled run again as its next attempt, continuing from the
        checkpoint of `step` (0: from the start). What the dead attempt wrote after `step`
        is deleted in the same transaction, so the new attempt replaces it rather than
        duplicating it."""
        with self._session() as s:
            row = find_run(s, run)
            status = RunStatus(row.status)
            if status not in (RunStatus.FAILED, RunStatus.CANCELLED):
                hint = (
                    "; `eslab clone` starts a new run from its configuration"
                    if status is RunStatus.SUCCEEDED
                    else ""
                )
                raise InvalidTransitionError(
                    f"run {row.id} is {status.value}; only a failed or cancelled run can be "
                    f"resumed{hint}"
                )
            attempt = (row.attempt or 1) + 1
            if not compare_and_set(
                s,
                row.id,
                [status],
                {
                    "status": RunStatus.QUEUED.value,
                    "attempt": attempt,
                    "error": None,
                    "ray_submission_id": None,
                    "finished_at": None,
                    "heartbeat_at": None,
                },
            ):
                raise StoreError(f"run {row.id} changed status while being resumed; try again")
            s.refresh(row)
            forget_steps_after(s, row, step)
            where = f"its checkpoint of step {step}" if step else "the start"
            s.add(event_row(row.id, "info", f"attempt {attempt} queued: resumes from {where}"))
            s.flush()
            return run_record(row)
