import sqlite3

import pytest
from sqlalchemy import inspect

from jobs.store.database import make_engine
from jobs.store.errors import SchemaOutdatedError, StoreError
from jobs.store.migrate import current_revision, downgrade, head_revision, upgrade
from jobs.store.store import Store

TABLES = {
    "runs",
    "metrics",
    "latest_metrics",
    "population",
    "samples",
    "checkpoints",
    "events",
    "scheduler_lock",
}


def test_upgrade_then_downgrade_on_a_fresh_file(db_url):
    upgrade(db_url)
    engine = make_engine(db_url)
    assert set(inspect(engine).get_table_names()) >= TABLES
    assert current_revision(engine) == head_revision()

    downgrade(db_url, "base")
    assert not TABLES & set(inspect(engine).get_table_names())
    assert current_revision(engine) is None

    upgrade(db_url)  # and back up again: downgrade must leave a clean slate
    assert set(inspect(engine).get_table_names()) >= TABLES
    engine.dispose()


def test_sqlite_runs_in_wal_mode_with_a_busy_timeout(sqlite_store, tmp_path):
    store = sqlite_store
    with store.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() >= 5000
    raw = sqlite3.connect(tmp_path / "eslab.db")
    assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"  # persistent on the file
    raw.close()


def test_indexes_serve_the_dashboard_queries(store):
    inspector = inspect(store.engine)
    assert inspector.get_pk_constraint("metrics")["constrained_columns"] == [
        "run_id",
        "key",
        "step",
    ]
    assert inspector.get_pk_constraint("latest_metrics")["constrained_columns"] == ["run_id", "key"]
    assert {"ix_runs_created_at", "ix_runs_status"} <= {
        i["name"] for i in inspector.get_indexes("runs")
    }


def test_store_refuses_an_unmigrated_database_and_names_the_command(db_url):
    with pytest.raises(SchemaOutdatedError, match="eslab db upgrade"):
        Store(db_url)


def test_store_refuses_an_older_migration(db_url):
    upgrade(db_url)
    engine = make_engine(db_url)
    with engine.begin() as conn:
        conn.exec_driver_sql("UPDATE alembic_version SET version_num = '0000'")
    engine.dispose()
    with pytest.raises(SchemaOutdatedError, match=r"migration 0000 .*eslab db upgrade"):
        Store(db_url)


def test_an_unreachable_database_gives_one_clear_line(tmp_path):
    with pytest.raises(StoreError, match=r"folder .* is missing"):
        Store(f"sqlite:///{tmp_path / 'no' / 'such' / 'dir' / 'x.db'}")
    with pytest.raises(StoreError, match="not a database URL"):
        Store("this is not a url")
    with pytest.raises(StoreError, match="cannot reach the database"):
        Store("postgresql+psycopg://nobody@127.0.0.1:1/nothing")


def test_0002_keeps_existing_runs_as_their_first_attempt(db_url):
    upgrade(db_url, "0001")
    engine = make_engine(db_url)
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "INSERT INTO runs (uuid, name, method, status, config, created_at, step, tags, notes)"
            " VALUES ('u-1', 'old', 'es', 'failed', '{}', '2026-01-01 00:00:00', 3, '[]', '')"
        )
    engine.dispose()
    upgrade(db_url)
    store = Store(db_url)
    assert store.get_run("u-1").attempt == 1
    assert store.acquire_lock("scheduler", "me", lease_seconds=5)
    store.close()
    downgrade(db_url, "0001")  # and back: the old schema, the run intact
    engine = make_engine(db_url)
    assert "scheduler_lock" not in inspect(engine).get_table_names()
    assert "attempt" not in {c["name"] for c in inspect(engine).get_columns("runs")}
    with engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT name FROM runs").scalar() == "old"
    engine.dispose()
