"""Named leases in the database: the scheduler's lock, so that one scheduler per database
hands queued runs to Ray, and a successor takes over once a dead holder's lease expires."""

from __future__ import annotations

from sqlalchemy import case, delete, update

from jobs.store import models
from jobs.store.records import LockRecord
from jobs.store.rows import aware, database_now, dialect_insert
from jobs.store.session import StoreBase


class Locks(StoreBase):
    def acquire_lock(self, name: str, owner: str, lease_seconds: float) -> bool:
        """Take the lock `name` or renew it; True while `owner` holds it. A lock whose lease
        has expired is free: its holder died or stopped renewing. Times are the database's
        (rows.database_now): schedulers on hosts whose clocks disagree still agree on when a
        lease ends."""
        now = database_now()
        expires = database_now(lease_seconds)
        lock = models.SchedulerLock
        with self._session() as s:
            renewed = s.execute(
                update(lock)
                .where(lock.name == name, (lock.owner == owner) | (lock.expires_at < now))
                .values(
                    owner=owner,
                    expires_at=expires,
                    acquired_at=case((lock.owner == owner, lock.acquired_at), else_=now),
                )
                .execution_options(synchronize_session=False)
            )
            if renewed.rowcount:
                return True
            inserted = s.execute(
                dialect_insert(s, lock)
                .values(name=name, owner=owner, acquired_at=now, expires_at=expires)
                .on_conflict_do_nothing(index_elements=["name"])
                .returning(lock.name)  # rowcount of an ignored insert is -1 on psycopg
            )
            return inserted.first() is not None

    def lock_holder(self, name: str) -> LockRecord | None:
        with self._session() as s:
            row = s.get(models.SchedulerLock, name)
            if row is None:
                return None
            return LockRecord(
                name=row.name,
                owner=row.owner,
                acquired_at=aware(row.acquired_at),
                expires_at=aware(row.expires_at),
            )

    def release_lock(self, name: str, owner: str) -> None:
        """Give the lock up at once (a clean shutdown), so a successor need not wait for the
        lease to expire."""
        lock = models.SchedulerLock
        with self._session() as s:
            s.execute(delete(lock).where(lock.name == name, lock.owner == owner))
