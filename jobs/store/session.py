"""The engine and the managed session that every part of the Store shares: each public
method opens one session, which commits on success, rolls back on any error, and turns
driver errors into StoreError (as in MLflow's `mlflow/store/db/utils.py`,
`_get_managed_session_maker`)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime

from sqlalchemy import Engine, select
from sqlalchemy.exc import OperationalError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from jobs.store.database import describe, make_engine
from jobs.store.errors import DatabaseUnavailableError, StoreError
from jobs.store.migrate import require_current_schema
from jobs.store.rows import aware, database_now


class StoreBase:
    """What the Store's parts (runs, step records, queue, locks, queries) build on: they
    reach the database only through `_session`."""

    def __init__(self, url: str | None = None, *, check_schema: bool = True) -> None:
        self.engine: Engine = make_engine(url)
        if check_schema:
            require_current_schema(self.engine)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)

    def close(self) -> None:
        self.engine.dispose()

    def database_now(self) -> datetime:
        """The database's current time (UTC): heartbeats are written in it, so silence is
        measured against it, never against this host's clock."""
        with self._session() as s:
            now = aware(s.scalar(select(database_now())))
        assert now is not None
        return now

    @contextmanager
    def _session(self) -> Iterator[Session]:
        session = self._sessions()
        try:
            yield session
            session.commit()
        except OperationalError as exc:
            session.rollback()
            error = DatabaseUnavailableError if is_transient(exc) else StoreError
            raise error(f"database {describe(str(self.engine.url))} failed: {exc.orig}") from exc
        except SQLAlchemyError as exc:
            session.rollback()
            raise StoreError(f"database error: {exc}") from exc
        except BaseException:
            session.rollback()
            raise
        finally:
            session.close()


TRANSIENT = (
    "database is locked",  # SQLite: another connection's write lock outlasted the busy timeout
    "database table is locked",
    "connection",  # PostgreSQL: refused, reset, closed, failed
    "server closed",
    "terminating connection",  # the server shutting down under a session
    "the database system is",  # ... starting up, shutting down, in recovery mode
    "could not receive data",
    "could not send data",
)


def is_transient(exc: OperationalError) -> bool:
    """Whether `exc` says the database was busy or away (a later try may work) rather than
    the request being wrong (a missing table, a full disk)."""
    text = str(exc.orig).lower()
    return bool(exc.connection_invalidated) or any(t in text for t in TRANSIENT)
