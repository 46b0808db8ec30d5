"""ORM rows in and out, shared by every part of the Store: finding a run, turning rows into
plain records, and the INSERT ... ON CONFLICT that SQLite and PostgreSQL share. Each helper
works on the caller's session, so it joins the caller's transaction."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import DateTime, Float, literal, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.orm import Session
from sqlalchemy.sql.functions import FunctionElement

from jobs.store import models
from jobs.store.errors import RunNotFoundError, StoreError
from jobs.store.records import RunRecord
from jobs.store.status import RunStatus


def utcnow() -> datetime:
    return datetime.now(UTC)


class DatabaseNow(FunctionElement):
    """The database server's current time (UTC), plus a number of seconds: what heartbeats
    and the scheduler's lease are written with and compared against. Workers, schedulers
    and dashboards run on several hosts whose clocks may disagree; the database is the one
    clock they share. SQLite's text format is SQLAlchemy's own (microseconds), so written
    values compare as text with those SQLAlchemy writes."""

    type = DateTime(timezone=True)
    name = "database_now"
    inherit_cache = True


def database_now(seconds: float = 0.0) -> DatabaseNow:
    """The SQL for the database's time `seconds` from now."""
    return DatabaseNow(literal(float(seconds), Float()))


@compiles(DatabaseNow, "sqlite")
def _sqlite_now(element: DatabaseNow, compiler: Any, **kw: Any) -> str:
    seconds = compiler.process(next(iter(element.clauses)), **kw)
    return f"strftime('%Y-%m-%d %H:%M:%f000', 'now', ({seconds}) || ' seconds')"


@compiles(DatabaseNow, "postgresql")
def _postgresql_now(element: DatabaseNow, compiler: Any, **kw: Any) -> str:
    seconds = compiler.process(next(iter(element.clauses)), **kw)
    return f"(now() + ({seconds}) * interval '1 second')"


def aware(value: datetime | None) -> datetime | None:
    """SQLite hands back naive datetimes; every time we store is UTC."""
    if value is not None and value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value


def plain_id(text: str) -> bool:
    """Whether `text` can be a row id: ASCII digits that fit a 64-bit database integer.
    str.isdigit() alone also passes '²', which int() refuses, and other scripts' digits."""
    return text.isascii() and text.isdigit() and len(text) <= 18


def find_run(session: Session, run: int | str) -> models.Run:
    """A run by its integer id, its uuid, or a unique uuid prefix (what the CLI prints). A
    string of digits is an id first, then a uuid prefix: uuids may start with digits only."""
    row = None
    if isinstance(run, int) or plain_id(run):
        row = session.get(models.Run, int(run))
    if row is None and isinstance(run, str):
        matches = session.scalars(
            select(models.Run).where(models.Run.uuid.startswith(run)).limit(2)
        ).all()
        if len(matches) > 1:
            raise RunNotFoundError(f"run id {run!r} is ambiguous; give more of the uuid")
        row = matches[0] if matches else None
    if row is None:
        raise RunNotFoundError(f"no run {run!r} in this database; `eslab runs` lists them")
    return row


def run_record(row: models.Run) -> RunRecord:
    return RunRecord(
        id=row.id,
        uuid=row.uuid,
        name=row.name,
        method=row.method,
        status=RunStatus(row.status),
        config=dict(row.config),
        created_at=aware(row.created_at),
        started_at=aware(row.started_at),
        finished_at=aware(row.finished_at),
        heartbeat_at=aware(row.heartbeat_at),
        step=row.step,
        total_steps=row.total_steps,
        error=row.error,
        tags=list(row.tags or []),
        notes=row.notes or "",
        parent_id=row.parent_id,
        ray_submission_id=row.ray_submission_id,
        attempt=row.attempt or 1,
        sweep_id=row.sweep_id,
        sweep_trial=row.sweep_trial,
    )


def event_row(run_id: int, level: str, message: str) -> models.Event:
    return models.Event(run_id=run_id, created_at=utcnow(), level=level, message=message)


def dialect_insert(session: Session, table: type[models.Base]) -> Any:
    """INSERT with the dialect's ON CONFLICT support (SQLite and PostgreSQL share it)."""
    dialect = session.get_bind().dialect.name
    if dialect == "sqlite":
        return sqlite_insert(table)
    if dialect == "postgresql":
        return pg_insert(table)
    raise StoreError(f"database dialect {dialect!r} is not supported (use SQLite or PostgreSQL)")


def upsert(
    session: Session,
    table: type[models.Base],
    rows: list[dict[str, Any]],
    keys: list[str],
    *,
    only_if_newer: bool = False,
) -> None:
    """Insert `rows`, or overwrite the rows with the same `keys`; with `only_if_newer`, only
    those whose step is not past the new one's (a late write cannot roll a value back)."""
    stmt = dialect_insert(session, table)
    updates = {c: stmt.excluded[c] for c in rows[0] if c not in keys}
    where = (table.__table__.c.step <= stmt.excluded.step) if only_if_newer else None
    session.execute(
        stmt.on_conflict_do_update(index_elements=keys, set_=updates, where=where), rows
    )
