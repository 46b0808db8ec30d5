import sqlite3

import pytest
from sqlalchemy import MetaData, inspect, select

from engine.sink import PopulationRecord, StepReport
from jobs.store.database import make_engine
from jobs.store.errors import SchemaNewerError, SchemaOutdatedError, StoreError
from jobs.store.migrate import current_revision, downgrade, head_revision, upgrade
from jobs.store.store import Store
from tests.jobs.test_store import CONFIG, make_run, step_report

TABLES = {
    "runs",
    "metrics",
    "latest_metrics",
    "population",
    "samples",
    "checkpoints",
    "events",
    "scheduler_lock",
    "sweeps",
}


def execute(db_url: str, *statements: str) -> None:
    """Run SQL on the database as it stands, in one transaction: rows as an earlier version
    of ES Lab wrote them, or a state only another program leaves."""
    engine = make_engine(db_url)
    with engine.begin() as conn:
        for statement in statements:
            conn.exec_driver_sql(statement)
    engine.dispose()


def old_run(step: int) -> str:
    """A failed run 'u-1' named 'old' at `step`, as every revision's runs table takes it."""
    return (
        "INSERT INTO runs (uuid, name, method, status, config, created_at, step, tags, notes)"
        f" VALUES ('u-1', 'old', 'es', 'failed', '{{}}', '2026-01-01 00:00:00', {step}, '[]', '')"
    )


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
    # a sweep's runs are listed through the unique (sweep_id, sweep_trial) constraint's index
    assert {
        "name": "uq_runs_sweep_id_sweep_trial",
        "column_names": ["sweep_id", "sweep_trial"],
    }.items() <= next(
        u for u in inspector.get_unique_constraints("runs") if u["name"].startswith("uq_runs_sw")
    ).items()


def test_a_new_empty_database_gets_the_schema_when_a_store_opens_it(db_url):
    Store(db_url).close()
    engine = make_engine(db_url)
    assert current_revision(engine) == head_revision()
    assert set(inspect(engine).get_table_names()) >= TABLES
    engine.dispose()


def test_a_database_with_other_tables_is_left_alone(db_url):
    engine = make_engine(db_url)
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE invoices (id INTEGER PRIMARY KEY)")
    with pytest.raises(SchemaOutdatedError, match="not an ES Lab database, so nothing was created"):
        Store(db_url)
    assert inspect(engine).get_table_names() == ["invoices"]
    engine.dispose()


def test_store_refuses_an_older_migration(db_url):
    upgrade(db_url, "0001")
    with pytest.raises(SchemaOutdatedError, match=r"migration 0001 .*eslab db upgrade"):
        Store(db_url)


def test_a_database_newer_than_the_code_says_so(db_url):
    upgrade(db_url)
    execute(db_url, "UPDATE alembic_version SET version_num = '0099_from_the_future'")
    newer = r"migration 0099_from_the_future, .* this code is older than the database"
    for attempt in (lambda: Store(db_url), lambda: upgrade(db_url), lambda: downgrade(db_url)):
        with pytest.raises(SchemaNewerError, match=newer) as refused:
            attempt()
        assert "eslab db upgrade" not in str(refused.value)


def test_an_unreachable_database_gives_one_clear_line(tmp_path):
    with pytest.raises(StoreError, match=r"folder .* is missing"):
        Store(f"sqlite:///{tmp_path / 'no' / 'such' / 'dir' / 'x.db'}")
    with pytest.raises(StoreError, match="not a database URL"):
        Store("this is not a url")
    with pytest.raises(StoreError, match="cannot reach the database"):
        Store("postgresql+psycopg://nobody@127.0.0.1:1/nothing")


def test_0002_keeps_existing_runs_as_their_first_attempt(db_url):
    upgrade(db_url, "0001")
    execute(db_url, old_run(step=3))
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


def table_contents(url: str) -> dict[str, list[tuple]]:
    """Every row of every table but Alembic's own, in primary-key order."""
    engine = make_engine(url)
    tables = MetaData()
    tables.reflect(engine)
    contents = {}
    with engine.connect() as conn:
        for name, table in tables.tables.items():
            if name != "alembic_version":
                query = select(table).order_by(*table.primary_key.columns)
                contents[name] = [tuple(row) for row in conn.execute(query)]
    engine.dispose()
    return contents


def test_down_to_the_first_migration_and_back_up_loses_no_row(db_url, tmp_path):
    """Batch mode rebuilds `runs` on SQLite (copy, DROP, rename): with foreign keys on, the
    DROP cascaded into every child table."""
    upgrade(db_url)
    store = Store(db_url)
    parent = make_run(store, name="parent")
    child = store.create_run(
        name="clone", method="es", config=CONFIG, total_steps=10, parent_id=parent.id
    )
    for run in (parent, child):
        for step in (1, 2):
            store.record_step(run.id, step_report(step, reward=float(step)))
        store.add_event(run.id, "info", "started")
        store.add_checkpoint(run.id, 2, str(tmp_path / f"ckpt-{run.id}"))
    store.close()
    before = table_contents(db_url)
    for table in ("runs", "metrics", "latest_metrics", "population", "samples", "events"):
        assert before[table], f"the test wrote no {table} row"
    assert before["checkpoints"]

    downgrade(db_url, "0001")
    upgrade(db_url)
    assert table_contents(db_url) == before


def test_a_row_that_refers_to_a_missing_run_stops_the_migration_and_changes_nothing(tmp_path):
    """With foreign keys off during a SQLite migration, the check before commit is what
    refuses broken references: the migration rolls back whole."""
    url = f"sqlite:///{tmp_path / 'eslab.db'}"
    upgrade(url, "0001")
    raw = sqlite3.connect(tmp_path / "eslab.db")  # foreign keys off: the orphan gets in
    raw.execute(
        "INSERT INTO events (run_id, created_at, level, message) VALUES (7, '', 'info', '')"
    )
    raw.commit()
    raw.close()
    with pytest.raises(StoreError, match=r"rolled back.*events.rowid 1 -> runs"):
        upgrade(url)
    engine = make_engine(url)
    assert current_revision(engine) == "0001"
    assert "scheduler_lock" not in inspect(engine).get_table_names()
    engine.dispose()


def test_0003_adds_each_samples_scores_and_leaves_earlier_rows_without(db_url):
    upgrade(db_url, "0002")
    execute(
        db_url,
        old_run(step=1),
        "INSERT INTO population (run_id, step, member, seed, fitness, reward, cost)"
        " VALUES (1, 1, 0, 7, 0.5, 1.0, -0.5)",
    )
    upgrade(db_url)
    store = Store(db_url)
    assert store.sample_scores("u-1", 1) == []  # recorded before: the members' means only
    assert store.population("u-1", 1)[0]["cost"] == -0.5
    scored = PopulationRecord(0, 7, 0.5, 0.0, 1.0, -0.5, sample_rewards=[1.0], sample_costs=[-0.5])
    store.record_step("u-1", StepReport(step=2, metrics={}, population=[scored]))
    assert store.sample_scores("u-1", 2) == [
        {"member": 0, "fitness": 0.5, "reward": 1.0, "cost": -0.5}
    ]
    store.close()
    downgrade(db_url, "0002")  # and back: the columns go, the rows stay
    engine = make_engine(db_url)
    columns = {c["name"] for c in inspect(engine).get_columns("population")}
    assert not {"sample_rewards", "sample_costs"} & columns
    with engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT count(*) FROM population").scalar() == 2
    engine.dispose()


def test_0004_adds_sweeps_and_leaves_earlier_runs_in_none(db_url):
    upgrade(db_url, "0003")
    execute(db_url, old_run(step=1))
    upgrade(db_url)
    store = Store(db_url)
    old = store.get_run("u-1")
    assert (old.sweep_id, old.sweep_trial) == (None, None)
    sweep = store.create_sweep(name="sw", spec={"method": "grid"}, base_config={})
    store.create_run(name="sw-t001", method="es", config={}, sweep_id=sweep.id, sweep_trial=1)
    assert [r.name for r in store.sweep_runs(sweep.id)] == ["sw-t001"]
    store.close()
    downgrade(db_url, "0003")  # and back: the sweeps go, every run stays
    engine = make_engine(db_url)
    assert "sweeps" not in inspect(engine).get_table_names()
    columns = {c["name"] for c in inspect(engine).get_columns("runs")}
    assert not {"sweep_id", "sweep_trial"} & columns
    with engine.connect() as conn:
        names = conn.exec_driver_sql("SELECT name FROM runs ORDER BY id").scalars().all()
    assert names == ["old", "sw-t001"]
    engine.dispose()


def test_0005_gives_earlier_sweeps_no_tags_and_its_downgrade_keeps_them(db_url):
    upgrade(db_url, "0004")
    execute(
        db_url,
        "INSERT INTO sweeps (name, status, method, spec, base_config, created_at, updated_at)"
        " VALUES ('old', 'finished', 'grid', '{}', '{}', '2026-01-01 00:00:00',"
        " '2026-01-01 00:00:00')",
    )
    upgrade(db_url)
    store = Store(db_url)
    assert store.get_sweep("old").tags == []
    new = store.create_sweep(name="new", spec={"method": "grid"}, base_config={}, tags=["a", "b"])
    assert store.get_sweep(new.id).tags == ["a", "b"]
    store.close()
    engine = make_engine(db_url)
    [tags] = [c for c in inspect(engine).get_columns("sweeps") if c["name"] == "tags"]
    assert tags["nullable"] is False
    engine.dispose()
    downgrade(db_url, "0004")  # and back: the column goes, every sweep stays
    engine = make_engine(db_url)
    assert "tags" not in {c["name"] for c in inspect(engine).get_columns("sweeps")}
    with engine.connect() as conn:
        names = conn.exec_driver_sql("SELECT name FROM sweeps ORDER BY id").scalars().all()
    assert names == ["old", "new"]
    engine.dispose()
