"""Sweeps: create, find and list them, list their runs, move their status. A sweep's runs
are ordinary runs that name it (`runs.sweep_id`, `runs.sweep_trial`); Runs.create_run joins
one to its sweep through `join_sweep`, in the run's own transaction.

What a sweep searches and when it queues its next run is jobs.sweeps' business; the store
keeps the rows and the two guarantees that must hold under racing writers: a run joins only
an active sweep, and a trial number is taken once."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import exists, func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from jobs.store import models
from jobs.store.errors import StoreError, SweepClosedError, SweepNotFoundError
from jobs.store.records import RunRecord, SweepRecord
from jobs.store.rows import aware, plain_id, run_record, utcnow
from jobs.store.session import StoreBase
from jobs.store.status import RunStatus, SweepStatus

NOT_ENDED = [s.value for s in RunStatus if not s.is_terminal()]


class Sweeps(StoreBase):
    def create_sweep(
        self,
        *,
        name: str,
        spec: dict[str, Any],
        base_config: dict[str, Any],
        created_by: str | None = None,
        tags: Sequence[str] = (),
    ) -> SweepRecord:
        """Store an active sweep; its runs come later, queued by jobs.sweeps.driver, each
        tagged with `tags`."""
        now = utcnow()
        row = models.Sweep(
            name=name,
            status=SweepStatus.ACTIVE.value,
            method=str(spec.get("method")),
            spec=spec,
            base_config=base_config,
            created_at=now,
            updated_at=now,
            created_by=created_by,
            tags=list(tags),
        )
        taken = StoreError(
            f"a sweep named {name!r} exists already; give this one another name "
            "(`eslab sweeps` lists them)"
        )
        with self._session() as s:
            if s.scalar(select(models.Sweep.id).where(models.Sweep.name == name)) is not None:
                raise taken
            s.add(row)
            try:
                s.flush()
            except IntegrityError:  # created by another process since the check
                raise taken from None
            return sweep_record(row)

    def get_sweep(self, sweep: int | str) -> SweepRecord:
        with self._session() as s:
            return sweep_record(find_sweep(s, sweep))

    def list_sweeps(self, *, limit: int = 100, offset: int = 0) -> list[SweepRecord]:
        """Newest first."""
        with self._session() as s:
            rows = s.scalars(
                select(models.Sweep)
                .order_by(models.Sweep.created_at.desc(), models.Sweep.id.desc())
                .limit(limit)
                .offset(offset)
            )
            return [sweep_record(r) for r in rows]

    def active_sweeps(self) -> list[SweepRecord]:
        """The sweeps that may queue runs, oldest first (the scheduler's pass)."""
        with self._session() as s:
            rows = s.scalars(
                select(models.Sweep)
                .where(models.Sweep.status == SweepStatus.ACTIVE.value)
                .order_by(models.Sweep.created_at, models.Sweep.id)
            )
            return [sweep_record(r) for r in rows]

    def sweep_runs(self, sweep: int | str) -> list[RunRecord]:
        """The sweep's runs in trial order."""
        with self._session() as s:
            sweep_id = find_sweep(s, sweep).id
            rows = s.scalars(
                select(models.Run)
                .where(models.Run.sweep_id == sweep_id)
                .order_by(models.Run.sweep_trial, models.Run.id)
            )
            return [run_record(r) for r in rows]

    def sweep_run_counts(self, sweep_ids: Iterable[int]) -> dict[int, dict[RunStatus, int]]:
        """How many runs of each status every sweep has (sweep lists), in one query."""
        ids = list(sweep_ids)
        run = models.Run
        out: dict[int, dict[RunStatus, int]] = {i: {} for i in ids}
        with self._session() as s:
            rows = s.execute(
                select(run.sweep_id, run.status, func.count())
                .where(run.sweep_id.in_(ids))
                .group_by(run.sweep_id, run.status)
            )
            for sweep_id, status, count in rows:
                out[sweep_id][RunStatus(status)] = count
        return out

    def set_sweep_status(
        self, sweep: int | str, status: SweepStatus, *, expected: Iterable[SweepStatus]
    ) -> bool:
        """Move the sweep to `status` if it is in one of `expected`; False when it is not
        (another writer moved it first). One conditional UPDATE, so of two racing writers
        one wins."""
        sources = [x.value for x in expected]
        with self._session() as s:
            sweep_id = find_sweep(s, sweep).id
            result = s.execute(
                update(models.Sweep)
                .where(models.Sweep.id == sweep_id, models.Sweep.status.in_(sources))
                .values(status=status.value, updated_at=utcnow())
                .execution_options(synchronize_session=False)
            )
            return result.rowcount == 1

    def reopen_sweeps(self) -> list[int]:
        """Make active again each finished sweep that has a live run (a run of it was
        resumed), so that its early stopping watches that run and the sweep finishes again
        once it ends; the ids of those sweeps."""
        sweep, run = models.Sweep, models.Run
        live = exists().where(run.sweep_id == sweep.id, run.status.in_(NOT_ENDED))
        with self._session() as s:
            ids = list(
                s.scalars(select(sweep.id).where(sweep.status == SweepStatus.FINISHED.value, live))
            )
            for sweep_id in ids:
                s.execute(
                    update(sweep)
                    .where(sweep.id == sweep_id, sweep.status == SweepStatus.FINISHED.value)
                    .values(status=SweepStatus.ACTIVE.value, updated_at=utcnow())
                    .execution_options(synchronize_session=False)
                )
            return ids


def find_sweep(session: Session, sweep: int | str) -> models.Sweep:
    """A sweep by its id, or by its name (a string of digits is an id first)."""
    row = None
    if isinstance(sweep, int) or plain_id(sweep):
        row = session.get(models.Sweep, int(sweep))
    if row is None and isinstance(sweep, str):
        row = session.scalar(select(models.Sweep).where(models.Sweep.name == sweep))
    if row is None:
        raise SweepNotFoundError(f"no sweep {sweep!r} in this database; `eslab sweeps` lists them")
    return row


def join_sweep(session: Session, sweep_id: int) -> None:
    """Let a run being created in `session` join sweep `sweep_id`, or raise
    SweepClosedError. The test is an UPDATE of the sweep's row, so a cancel racing with it
    either comes first (and this refuses) or waits for this transaction (and then sees the
    run to cancel): on PostgreSQL the UPDATE locks the row, on SQLite the write lock covers
    the whole transaction."""
    sweep = models.Sweep
    result = session.execute(
        update(sweep)
        .where(sweep.id == sweep_id, sweep.status == SweepStatus.ACTIVE.value)
        .values(updated_at=utcnow())
        .execution_options(synchronize_session=False)
    )
    if result.rowcount != 1:
        status = session.scalar(select(sweep.status).where(sweep.id == sweep_id))
        if status is None:
            raise SweepNotFoundError(f"no sweep {sweep_id} in this database")
        raise SweepClosedError(f"sweep {sweep_id} is {status}: it queues no more runs")


def sweep_record(row: models.Sweep) -> SweepRecord:
    return SweepRecord(
        id=row.id,
        name=row.name,
        status=SweepStatus(row.status),
        method=row.method,
        spec=dict(row.spec),
        base_config=dict(row.base_config),
        created_at=aware(row.created_at),
        updated_at=aware(row.updated_at),
        created_by=row.created_by,
        tags=list(row.tags or []),
    )
