"""Schema migrations (Alembic, scripts in migrations/): upgrade, downgrade, and the check that
refuses to run on a database at an older migration."""

from __future__ import annotations

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine
from sqlalchemy.exc import OperationalError, SQLAlchemyError

from engine.paths import PROJECT_ROOT
from jobs.store.database import database_url, describe, make_engine
from jobs.store.errors import SchemaOutdatedError, StoreError

UPGRADE_HINT = "run `eslab db upgrade` (or `make run`)"


def alembic_config(url: str | None = None) -> Config:
    config = Config()
    config.set_main_option("script_location", str(PROJECT_ROOT / "migrations"))
    config.attributes["url"] = url or database_url()
    return config


def head_revision() -> str:
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
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


def _run(action, url: str | None, revision: str) -> None:
    url = url or database_url()
    make_engine(url).dispose()  # validates the URL and folder with a clear message first
    try:
        action(alembic_config(url), revision)
    except OperationalError as exc:
        raise StoreError(
            f"cannot migrate the database {describe(url)}: {exc.orig}; check ESLAB_DATABASE_URL"
        ) from exc
    except SQLAlchemyError as exc:
        raise StoreError(f"migration of {describe(url)} failed: {exc}") from exc


def require_current_schema(engine: Engine) -> None:
    current, head = current_revision(engine), head_revision()
    if current == head:
        return
    where = describe(str(engine.url))
    if current is None:
        raise SchemaOutdatedError(f"the database {where} has no ES Lab tables yet; {UPGRADE_HINT}")
    raise SchemaOutdatedError(
        f"the database {where} is at migration {current} but this ES Lab needs {head}; "
        f"{UPGRADE_HINT}"
    )
