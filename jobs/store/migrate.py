"""Schema migrations (Alembic, scripts in migrations/): upgrade, downgrade, and the check
every Store makes when it opens a database: a new, empty database gets the schema (as
MLflow's tracking store does), a database at an older migration is refused with the command
to run, and a database newer than this code is refused as such."""

from __future__ import annotations

from collections.abc import Callable

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, inspect
from sqlalchemy.exc import OperationalError, SQLAlchemyError

from engine.paths import PROJECT_ROOT
from jobs.store.database import database_url, describe, make_engine
from jobs.store.errors import SchemaNewerError, SchemaOutdatedError, StoreError

UPGRADE_HINT = "run `eslab db upgrade` (or `make run`)"
VERSION_TABLE = "alembic_version"


def alembic_config(url: str | None = None) -> Config:
    config = Config()
    config.set_main_option("script_location", str(PROJECT_ROOT / "migrations"))
    if url is not None:
        config.attributes["url"] = url
    return config


def _scripts() -> ScriptDirectory:
    return ScriptDirectory.from_config(alembic_config())


def head_revision() -> str:
    head = _scripts().get_current_head()
    assert head is not None, "migrations/versions has no revision"
    return head


def current_revision(engine: Engine) -> str | None:
    try:
        with engine.connect() as connection:
            return MigrationContext.configure(connection).get_current_revision()
    except OperationalError as exc:
        raise StoreError(
            f"cannot reach the database {describe(str(engine.url))}: {exc.orig}; "
            "check ESLAB_DATABASE_URL"
        ) from exc


def upgrade(url: str | None = None, revision: str = "head") -> None:
    _run(command.upgrade, url, revision)


def downgrade(url: str | None = None, revision: str = "-1") -> None:
    _run(command.downgrade, url, revision)


def _run(action: Callable[[Config, str], None], url: str | None, revision: str) -> None:
    url = url or database_url()
    engine = make_engine(url)  # validates the URL and folder with a clear message first
    try:
        current = current_revision(engine)
    finally:
        engine.dispose()
    if current is not None:
        _refuse_unknown(current, describe(url))
    try:
        action(alembic_config(url), revision)
    except OperationalError as exc:
        raise StoreError(
            f"cannot migrate the database {describe(url)}: {exc.orig}; check ESLAB_DATABASE_URL"
        ) from exc
    except SQLAlchemyError as exc:
        raise StoreError(f"migration of {describe(url)} failed: {exc}") from exc


def require_current_schema(engine: Engine) -> None:
    """Return when the database is at the latest migration, creating the schema first in a
    database that has no table at all. Two processes may do that at once: migrations/env.py
    makes each migration one transaction that locks out the others, and the second finds
    the schema done."""
    current = current_revision(engine)
    if current is None:
        if not set(inspect(engine).get_table_names()) - {VERSION_TABLE}:
            upgrade(engine.url.render_as_string(hide_password=False))
        # Read again: another process may have created the schema since the first read.
        current = current_revision(engine)
    head = head_revision()
    if current == head:
        return
    where = describe(str(engine.url))
    if current is None:
        raise SchemaOutdatedError(
            f"the database {where} has tables but no ES Lab migration: it is not an ES Lab "
            "database, so nothing was created in it; point ESLAB_DATABASE_URL at a new or "
            f"empty database (or, to add ES Lab's tables to this one, {UPGRADE_HINT})"
        )
    _refuse_unknown(current, where)
    raise SchemaOutdatedError(
        f"the database {where} is at migration {current} but this ES Lab needs {head}; "
        f"{UPGRADE_HINT}"
    )


def _refuse_unknown(current: str, where: str) -> None:
    """A revision that none of migrations/versions has was written by a newer ES Lab:
    upgrading cannot help, and downgrading needs the migration scripts this code lacks."""
    if current not in {script.revision for script in _scripts().walk_revisions()}:
        raise SchemaNewerError(
            f"the database {where} is at migration {current}, which this ES Lab does not "
            f"know (its latest is {head_revision()}): this code is older than the database. "
            "Use the newer ES Lab that migrated it, or point ESLAB_DATABASE_URL at another "
            "database"
        )
