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
from jobs.store.errors import StoreError
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
            raise StoreError(
                f"database {describe(str(self.engine.url))} failed: {exc.orig}"
            ) from exc
        except SQLAlchemyError as exc:
            session.rollback()
            raise StoreError(f"database error: {exc}") from exc
        except BaseException:
            session.rollback()
            raise
        finally:
            session.close()
