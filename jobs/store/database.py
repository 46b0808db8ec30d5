"""Which database, and how to connect to it.

SQLite by default (`data/eslab.db`), in WAL mode with a busy timeout so that the worker, the
scheduler and the dashboard can read while one of them writes (MLflow PR 6490).
`ESLAB_DATABASE_URL` selects any other SQLAlchemy URL, PostgreSQL for a shared deployment.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from engine.extras import require
from engine.paths import data_dir
from jobs.store.errors import StoreError

BUSY_TIMEOUT_MS = 30_000


def database_url() -> str:
    """ESLAB_DATABASE_URL, else ESLAB_DATABASE_URL_FILE (a file holding the URL: how the
    scheduler hands a URL with a password to its Ray jobs, whose environment variables the
    Ray dashboard shows to anyone who can open it), else data/eslab.db."""
    url = os.environ.get("ESLAB_DATABASE_URL")
    if not url and os.environ.get("ESLAB_DATABASE_URL_FILE"):
        path = Path(os.environ["ESLAB_DATABASE_URL_FILE"])
        try:
            url = path.read_text().strip()
        except OSError as exc:
            raise StoreError(f"ESLAB_DATABASE_URL_FILE {path}: cannot read it ({exc})") from exc
    return url if url else f"sqlite:///{data_dir() / 'eslab.db'}"


def describe(url: str) -> str:
    """The URL without its password, for messages."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return url


def make_engine(url: str | None = None) -> Engine:
    url = url or database_url()
    try:
        parsed = make_url(url)
    except ArgumentError as exc:
        raise StoreError(
            f"ESLAB_DATABASE_URL {url!r} is not a database URL "
            "(expected e.g. sqlite:///path/eslab.db or postgresql+psycopg://user@host/db)"
        ) from exc
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            folder = os.path.dirname(os.path.abspath(parsed.database))
            if not os.path.isdir(folder):
                raise StoreError(f"cannot create the database {url}: folder {folder} is missing")
        engine = create_engine(url, connect_args={"timeout": BUSY_TIMEOUT_MS / 1000})
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    if parsed.get_driver_name() == "psycopg":
        require("psycopg", "postgres", f"the database {describe(url)}")
    try:
        return create_engine(url, pool_pre_ping=True)
    except Exception as exc:  # a missing driver surfaces here, as an ImportError or so
        raise StoreError(f"cannot use database {describe(url)}: {exc}") from exc


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
    cursor.execute("PRAGMA foreign_keys=ON")
    # NORMAL is durable across application crashes in WAL mode (only a power loss can drop
    # the last transactions), and makes per-step commits cheap.
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()
