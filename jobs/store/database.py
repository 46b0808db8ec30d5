"""Which database, and how to connect to it.

SQLite by default (`data/eslab.db`), in WAL mode with a busy timeout so that the worker, the
scheduler and the dashboard can read while one of them writes (MLflow PR 6490).
`ESLAB_DATABASE_URL` selects any other SQLAlchemy URL, PostgreSQL for a shared deployment.
"""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path
from typing import Any

from sqlalchemy import URL, Connection, Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError

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
    """The URL without its password (in the user part or a `password=` query option), for
    messages. A URL that does not parse keeps only what follows its last `@`."""
    try:
        parsed = parse_url(url)
    except (ArgumentError, ValueError):
        scheme, sep, rest = url.rpartition("://")
        return f"{scheme}{sep}***@{rest.rpartition('@')[2]}" if "@" in rest else url
    hidden = {key: "***" for key in parsed.query if "password" in key.lower()}
    return parsed.update_query_dict(hidden).render_as_string(hide_password=True)


def parse_url(url: str) -> URL:
    """`url` as SQLAlchemy reads it, except that the user part ends at the LAST `@` of the
    address, as in libpq's and a browser's reading. SQLAlchemy ends the password at the first
    `@`, so a password holding one spilled into the host: `describe` then showed that part,
    and the driver's "cannot resolve host" error repeated it."""
    parsed = make_url(url)
    if parsed.password is None or not parsed.host or "@" not in parsed.host:
        return parsed
    spill, _, host = parsed.host.rpartition("@")
    return parsed.set(password=f"{parsed.password}@{spill}", host=host)


def make_engine(url: str | None = None, *, migrating: bool = False) -> Engine:
    """An engine for `url` (else `database_url()`); a URL that cannot work is refused here
    in one line that names the setting and never shows the password.

    `migrating` is for migrations/env.py. On SQLite, Alembic's batch mode rebuilds a table
    (create a copy, DROP the old one, rename): with foreign keys on, dropping `runs` would
    fire ON DELETE CASCADE and empty every child table. So a migration's connections keep
    foreign keys off (set on connect: the pragma does nothing inside a transaction; env.py
    checks them after) and start their transactions with BEGIN IMMEDIATE, which makes a
    migration one transaction that holds the write lock from its first read."""
    url = url or database_url()
    parsed = _parse(url)
    if parsed.get_backend_name() == "sqlite":
        return _sqlite_engine(url, parsed.database, migrating=migrating)
    if parsed.get_driver_name() == "psycopg":
        require("psycopg", "postgres", f"the database {describe(url)}")
    try:
        return create_engine(parsed, pool_pre_ping=True)
    except Exception as exc:  # a missing driver surfaces here, as an ImportError or so
        raise StoreError(f"cannot use database {describe(url)}: {exc}") from exc


def _parse(url: str) -> URL:
    """The URL, its port and its dialect checked, so that a typo is one line, not a driver
    traceback."""
    where = f"{_setting()} {describe(url)}"
    try:
        parsed = parse_url(url)
    except ArgumentError as exc:
        raise StoreError(
            f"{where} is not a database URL "
            "(expected e.g. sqlite:///path/eslab.db or postgresql+psycopg://user@host/db)"
        ) from exc
    except ValueError as exc:  # the only number in a URL is its port
        raise StoreError(f"{where}: the port is not a number from 1 to 65535") from exc
    if parsed.port is not None and not 1 <= parsed.port <= 65535:
        raise StoreError(f"{where}: the port {parsed.port} is not a number from 1 to 65535")
    try:
        parsed.get_dialect()
    except NoSuchModuleError as exc:
        raise StoreError(
            f"{where}: SQLAlchemy knows no database {parsed.drivername!r} "
            "(expected sqlite:///... or postgresql+psycopg://...)"
        ) from exc
    return parsed


def _setting() -> str:
    """Where the URL came from, for messages."""
    if not os.environ.get("ESLAB_DATABASE_URL") and os.environ.get("ESLAB_DATABASE_URL_FILE"):
        return f"the URL in ESLAB_DATABASE_URL_FILE ({os.environ['ESLAB_DATABASE_URL_FILE']})"
    return "ESLAB_DATABASE_URL"


def _sqlite_engine(url: str, database: str | None, *, migrating: bool) -> Engine:
    if database and database != ":memory:":
        folder = os.path.dirname(os.path.abspath(database))
        if not os.path.isdir(folder):
            raise StoreError(
                f"cannot create the database {describe(url)}: folder {folder} is missing"
            )
    engine = create_engine(url, connect_args={"timeout": BUSY_TIMEOUT_MS / 1000})
    event.listen(engine, "connect", _sqlite_pragmas)
    if migrating:
        event.listen(engine, "connect", _sqlite_migration_connection)
        event.listen(engine, "begin", _begin_immediate)
    return engine


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
    _use_wal(cursor)
    cursor.execute("PRAGMA foreign_keys=ON")
    # NORMAL is durable across application crashes in WAL mode (only a power loss can drop
    # the last transactions), and makes per-step commits cheap.
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


def _use_wal(cursor: Any) -> None:
    """WAL mode, retried while the file is locked. Switching a new database to WAL upgrades a
    shared lock to an exclusive one, and where another process holds a lock SQLite answers
    "database is locked" at once instead of calling its busy handler (which could deadlock):
    processes that open one new database together met it. WAL is stored in the file, so once
    one of them switched it, the others' switch is a no-op."""
    deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def _sqlite_migration_connection(dbapi_connection: Any, _record: Any) -> None:
    dbapi_connection.execute("PRAGMA foreign_keys=OFF")
    # The driver's own transaction handling would begin only before INSERT/UPDATE/DELETE and
    # leave DDL outside; `_begin_immediate` begins instead (SQLAlchemy's pysqlite recipe).
    dbapi_connection.isolation_level = None


def _begin_immediate(connection: Connection) -> None:
    connection.exec_driver_sql("BEGIN IMMEDIATE")
