"""Alembic environment: the URL and the engine come from jobs.store, so migrations see the
same ESLAB_DATABASE_URL as everything else.

Every migration run is one transaction (the engine of `make_engine(migrating=True)` makes
that true on SQLite too) that first locks out any other migration of the same database, so
two processes that find a new, empty database (`eslab serve` and a worker) can both create
its schema: the second finds it done. On SQLite the migration runs with foreign keys off, so
that batch mode's DROP of a rebuilt table cascades into nothing, and checks them before it
commits: a violation rolls the whole migration back."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection, text

from jobs.store.database import database_url, describe, make_engine
from jobs.store.errors import StoreError
from jobs.store.models import Base

# Any fixed number: the key of PostgreSQL's advisory lock that migrations of one database take.
MIGRATION_LOCK_KEY = 0x65736C6162  # "eslab"

config = context.config
url = config.attributes.get("url") or config.get_main_option("sqlalchemy.url") or database_url()


def run_migrations_offline() -> None:
    context.configure(
        url=url, target_metadata=Base.metadata, render_as_batch=True, literal_binds=True
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    engine = make_engine(url, migrating=True)
    try:
        with engine.connect() as connection:
            # Batch mode lets later migrations ALTER tables on SQLite (copy-and-move).
            context.configure(
                connection=connection,
                target_metadata=Base.metadata,
                render_as_batch=True,
                transactional_ddl=True,
            )
            with context.begin_transaction():
                _lock_out_other_migrations(connection)
                context.run_migrations()
                _check_foreign_keys(connection)
    finally:
        engine.dispose()


def _lock_out_other_migrations(connection: Connection) -> None:
    """SQLite's BEGIN IMMEDIATE already holds the write lock; PostgreSQL needs an advisory
    lock, held until this transaction ends, before Alembic reads the current revision."""
    if connection.dialect.name == "postgresql":
        connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK_KEY})
    elif (
        connection.dialect.name == "sqlite"
        and connection.exec_driver_sql("PRAGMA foreign_keys").scalar()
    ):
        raise StoreError(
            f"refusing to migrate {describe(str(connection.engine.url))} with foreign keys on: "
            "rebuilding a table would delete the rows that refer to it"
        )


def _check_foreign_keys(connection: Connection) -> None:
    """What foreign keys would have refused while they were off, refused now (SQLite)."""
    if connection.dialect.name != "sqlite":
        return
    broken = connection.exec_driver_sql("PRAGMA foreign_key_check").fetchall()
    if broken:
        links = sorted({f"{table}.rowid {rowid} -> {parent}" for table, rowid, parent, _ in broken})
        raise StoreError(
            f"migration of {describe(str(connection.engine.url))} rolled back, nothing changed: "
            f"{len(broken)} row(s) refer to rows that do not exist ({', '.join(links[:5])})"
        )


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
