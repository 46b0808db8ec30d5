"""Conditional writes to a run's row, shared by the queue (queue.py) and the training's
writes (steps.py): a status change that exactly one of racing writers wins, and the fence
that keeps an attempt that is over from writing.

Both are one `UPDATE runs ... WHERE` whose condition is the test, so no writer can slip in
between the test and the write: on PostgreSQL the UPDATE locks the row until the commit
(a concurrent `resume_run` waits, or wins and the fenced UPDATE then matches nothing), on
SQLite the write lock covers the whole transaction."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from jobs.store import models
from jobs.store.errors import StaleAttemptError
from jobs.store.rows import find_run
from jobs.store.status import LIVE, RunStatus


def compare_and_set(
    session: Session,
    run_id: int,
    sources: Iterable[RunStatus],
    values: dict[str, Any],
    *,
    extra: Any = None,
) -> bool:
    """UPDATE runs SET values WHERE id = run_id AND status IN sources (AND extra)."""
    where = [models.Run.id == run_id, models.Run.status.in_([x.value for x in sources])]
    if extra is not None:
        where.append(extra)
    result = session.execute(
        update(models.Run)
        .where(*where)
        .values(**values)
        .execution_options(synchronize_session=False)
    )
    return result.rowcount == 1


def write_as(session: Session, run: int | str, attempt: int | None, **values: Any) -> int:
    """Write `values` to the run's row as attempt `attempt`, and return the run's id. The
    write is refused with StaleAttemptError unless the run is still at that attempt and
    live (running or cancelling): a resume started another attempt, or the run was ended
    behind this attempt's back (the scheduler's heartbeat timeout). Raised inside the
    caller's session, the error rolls back everything the caller wrote with it. `attempt`
    None writes unfenced (a caller that is no attempt: tests and tools filling a
    database)."""
    run_id = find_run(session, run).id
    if attempt is None:
        if values:
            session.execute(
                update(models.Run)
                .where(models.Run.id == run_id)
                .values(**values)
                .execution_options(synchronize_session=False)
            )
        return run_id
    # With nothing else to write, the row is still updated (to itself): the UPDATE is the
    # test, and on PostgreSQL its row lock holds off a resume until this commits.
    fenced = values or {"attempt": models.Run.attempt}
    if not compare_and_set(session, run_id, LIVE, fenced, extra=models.Run.attempt == attempt):
        raise stale_attempt(session, run_id, attempt)
    return run_id


def stale_attempt(session: Session, run_id: int, attempt: int) -> StaleAttemptError:
    """The refusal, saying what ended the attempt."""
    status, current = session.execute(
        select(models.Run.status, models.Run.attempt).where(models.Run.id == run_id)
    ).one()
    why = (
        f"the run was resumed as attempt {current}"
        if current != attempt
        else f"the run is {status} (it was ended outside this attempt)"
    )
    return StaleAttemptError(f"run {run_id}: attempt {attempt} may no longer write: {why}")
