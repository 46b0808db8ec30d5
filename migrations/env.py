"""Alembic environment: the URL and the engine come from jobs.store, so migrations see the
same pragmas and the same ESLAB_DATABASE_URL as everything else."""

from __future__ import annotations

from alembic import context

from jobs.store.database import make_engine
from jobs.store.models import Base

config = context.config
url = config.attributes.get("url") or config.get_main_option("sqlalchemy.url") or None


def run_migrations_offline() -> None:
    context.configure(
        url=url, target_metadata=Base.metadata, render_as_batch=True, literal_binds=True
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    engine = make_engine(url)
    with engine.connect() as connection:
        # Batch mode lets later migrations ALTER tables on SQLite (copy-and-move).
        context.configure(
            connection=connection, target_metadata=Base.metadata, render_as_batch=True
        )
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
