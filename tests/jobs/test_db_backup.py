"""`eslab db backup` and `eslab db restore` (jobs.store.backup), on SQLite and PostgreSQL: a
backup taken while a run writes holds whole steps only, a restore gives every row back, a
database with runs is replaced only with --force and never while in use, bad files get one
line naming them, and the password of a PostgreSQL URL shows nowhere."""

from __future__ import annotations

import os
import sqlite3
import stat
import subprocess
import threading

import pytest
from sqlalchemy import MetaData, select, text

from app.cli import main
from engine.sink import PopulationRecord, SampleRecord, StepReport
from jobs.store import backup
from jobs.store.backup import SQLITE_HEADER, backup_database, restore_database
from jobs.store.database import make_engine
from jobs.store.migrate import upgrade
from jobs.store.status import RunStatus
from jobs.store.store import Store
from tests.jobs.conftest import PostgresServer
from tests.jobs.test_migrations import execute, old_run
from tests.jobs.test_store import make_run

KEYS, MEMBERS, SAMPLES = 12, 4, 3
PASSWORD = "pa:ss@w\\rd-7f3Q"


def report(step: int) -> StepReport:
    """A step with KEYS metrics, MEMBERS population rows and SAMPLES samples: a backup must
    hold all of them or none."""
    return StepReport(
        step=step,
        metrics={f"train/m{k}": step + k / 100 for k in range(KEYS)},
        population=[
            PopulationRecord(
                member=m, seed=step * 10 + m, fitness=m / 3, shaped_fitness=-m, sample_rewards=[m]
            )
            for m in range(MEMBERS)
        ],
        samples=[
            SampleRecord(
                split="train",
                prompt_index=i,
                sample_index=0,
                prompt=f"prompt {step}/{i} ✓",
                completion="answer",
                reward=0.5,
                reward_parts={"format": 1.0},
            )
            for i in range(SAMPLES)
        ],
    )


@pytest.fixture
def fresh_url(db_url, tmp_path, request) -> str:
    """Another, empty database of db_url's kind."""
    if db_url.startswith("sqlite"):
        return f"sqlite:///{tmp_path / 'restored.db'}"
    return request.getfixturevalue("postgres").create_database()


@pytest.fixture
def filled(store):
    return fill(store)


@pytest.fixture
def sqlite_filled(sqlite_store):
    return fill(sqlite_store)


def fill(store: Store) -> Store:
    """Every table with rows: a sweep and its trial, runs with steps, a checkpoint, events,
    the scheduler's lock."""
    sweep = store.create_sweep(name="sw", spec={"method": "grid"}, base_config={}, tags=["t"])
    first = make_run(store, name="first", tags=["a"], notes="ü")
    make_run(store, name="trial", sweep_id=sweep.id, sweep_trial=0, parent_id=first.id)
    for step in range(3):
        store.record_step(first.id, report(step))
    store.add_checkpoint(first.id, 2, "/data/runs/first/checkpoint-2")
    store.add_event(first.id, "info", "started")
    store.set_status(first.id, RunStatus.RUNNING)
    store.acquire_lock("scheduler", "host:1", 60)
    store.close()  # a restore refuses a database in use; the tests reopen it when needed
    return store


def eslab(monkeypatch, capsys, url: str, *argv: str) -> tuple[int, str, str]:
    monkeypatch.setenv("ESLAB_DATABASE_URL", url)
    code = main(["db", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def one_error_line(err: str) -> bool:
    """The command ended with one line of error (after any progress bar), no traceback."""
    return "Traceback" not in err and err.splitlines()[-1].startswith("eslab: error: ")


def contents(url: str) -> dict[str, list[tuple]]:
    """Every row of every table, ordered, as the database returns them."""
    engine = make_engine(url)
    tables = MetaData()
    tables.reflect(engine)
    with engine.connect() as connection:
        rows = {
            name: sorted((tuple(row) for row in connection.execute(select(t))), key=repr)
            for name, t in tables.tables.items()
        }
    engine.dispose()
    return rows


def run_names(url: str) -> set[str]:
    engine = make_engine(url)
    with engine.connect() as connection:
        names = set(connection.scalars(text("SELECT name FROM runs")))
    engine.dispose()
    return names


# -- a backup while a run writes -------------------------------------------------------------


class Writer(threading.Thread):
    """A run's worker: writes step after step through a Store of its own until stopped."""

    def __init__(self, url: str, run_id: int) -> None:
        super().__init__(daemon=True)
        self.store, self.run_id = Store(url), run_id
        self.steps = 0
        self.written = threading.Condition()
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                self.store.record_step(self.run_id, report(self.steps))
                with self.written:
                    self.steps += 1
                    self.written.notify_all()
        except BaseException as exc:  # seen by the test
            self.error = exc
        finally:
            self.store.close()

    def wait_for(self, steps: int) -> None:
        with self.written:
            assert self.written.wait_for(lambda: self.steps >= steps or self.error, timeout=60)


def test_a_backup_taken_while_a_run_writes_holds_whole_steps(
    store, db_url, fresh_url, tmp_path, monkeypatch
):
    runs = [make_run(store, name=f"r{i}") for i in range(5)]
    writer = Writer(db_url, runs[0].id)
    writer.start()
    writer.wait_for(20)
    during: list[int] = []
    copied: list[int] = []  # how far the copy was at each update of its progress bar

    def bar_after_more_writes(description, total=None):
        # The copy has begun (SQLite: its snapshot is taken; PostgreSQL: pg_dump runs):
        # let the run commit two more steps before it goes on.
        during.append(writer.steps)
        writer.wait_for(writer.steps + 2)
        bar = original_bar(description, total)
        update = bar.update

        def update_and_record(n=1):
            update(n)
            copied.append(bar.n)
            if len(copied) == 1:  # and two more in the middle of the copy
                writer.wait_for(writer.steps + 2)

        bar.update = update_and_record
        return bar

    original_bar = backup._progress_bar
    file = tmp_path / "backup.db"
    try:
        with monkeypatch.context() as patch:
            patch.setattr(backup, "_progress_bar", bar_after_more_writes)
            patch.setattr(backup, "PAGES_PER_STEP", 1)
            backup_database(file, url=db_url)
    finally:
        writer.stop.set()
        writer.join(60)
    assert writer.error is None
    assert during and writer.steps >= during[0] + 2  # the run wrote while the copy ran
    if db_url.startswith("sqlite"):  # one pass over one snapshot: never begun again
        assert copied == sorted(set(copied))
    store.close()

    assert restore_database(file, url=fresh_url) is None
    restored = make_engine(fresh_url)
    with restored.connect() as c:
        assert {r.id for r in runs} <= set(c.scalars(text("SELECT id FROM runs")))
        steps = {
            table: dict(c.execute(text(f"SELECT step, count(*) FROM {table} GROUP BY step")).all())
            for table in ("metrics", "population", "samples")
        }
        run_step = c.scalar(text(f"SELECT step FROM runs WHERE id = {runs[0].id}"))
        latest = set(c.scalars(text("SELECT step FROM latest_metrics")))
    restored.dispose()
    last = max(steps["metrics"])
    assert 20 <= last + 1 <= writer.steps
    assert steps["metrics"] == dict.fromkeys(range(last + 1), KEYS)
    assert steps["population"] == dict.fromkeys(range(last + 1), MEMBERS)
    assert steps["samples"] == dict.fromkeys(range(last + 1), SAMPLES)
    assert run_step == last and latest == {last}


# -- restore -----------------------------------------------------------------------------------


def test_restore_into_a_new_database_gives_every_row_back(
    filled, db_url, fresh_url, tmp_path, monkeypatch, capsys
):
    file = tmp_path / "backup.dump"
    code, out, err = eslab(monkeypatch, capsys, db_url, "backup", str(file))
    assert code == 0, err
    assert f"backed up to {file}" in out
    if db_url.startswith("sqlite"):
        assert "100%" in err  # the progress bar
        assert stat.S_IMODE(file.stat().st_mode) == 0o600
    code, out, err = eslab(monkeypatch, capsys, fresh_url, "restore", str(file))
    assert code == 0, err
    assert f"restored {file}" in out and "migration 0005 (latest 0005)" in out
    before, after = contents(db_url), contents(fresh_url)
    assert {"runs", "metrics", "samples", "sweeps", "alembic_version"} <= set(after)
    assert all(before[name] for name in before), "every table has rows to compare"
    assert after == before
    restored = Store(fresh_url)  # the schema check passes: ES Lab opens it as it is
    assert {run.name for run in restored.list_runs()} == {"first", "trial"}
    restored.close()


def test_a_database_with_runs_is_replaced_only_with_force(
    filled, db_url, tmp_path, monkeypatch, capsys
):
    file = tmp_path / "backup.dump"
    assert eslab(monkeypatch, capsys, db_url, "backup", str(file))[0] == 0
    later = Store(db_url)
    make_run(later, name="later")
    later.close()

    code, _, err = eslab(monkeypatch, capsys, db_url, "restore", str(file))
    assert code == 2 and "holds 3 run(s)" in err and "--force" in err
    assert "Traceback" not in err
    assert run_names(db_url) == {"first", "trial", "later"}

    code, _, err = eslab(monkeypatch, capsys, db_url, "restore", "--force", str(file))
    assert code == 0, err
    assert run_names(db_url) == {"first", "trial"}


def test_a_database_in_use_is_not_replaced(filled, db_url, tmp_path, monkeypatch, capsys):
    file = tmp_path / "backup.dump"
    assert eslab(monkeypatch, capsys, db_url, "backup", str(file))[0] == 0
    service = Store(db_url)
    make_run(service, name="later")  # its pool keeps the connection open, as serve's does
    try:
        code, _, err = eslab(monkeypatch, capsys, db_url, "restore", "--force", str(file))
    finally:
        service.close()
    assert code == 2 and "is in use" in err and "stop `eslab serve`" in err
    assert run_names(db_url) == {"first", "trial", "later"}


def test_a_failed_restore_leaves_the_database_as_it_was(
    sqlite_filled, sqlite_url, tmp_path, monkeypatch, capsys
):
    file = tmp_path / "backup.db"
    assert eslab(monkeypatch, capsys, sqlite_url, "backup", str(file))[0] == 0
    before = contents(sqlite_url)

    def copy_half(source, temp, description):
        temp.write_bytes(file.read_bytes()[:4096])
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(backup, "_copy_pages", copy_half)
    code, _, err = eslab(monkeypatch, capsys, sqlite_url, "restore", "--force", str(file))
    assert code == 2 and f"cannot restore backup file {file}: disk I/O error" in err
    assert contents(sqlite_url) == before
    assert not list(tmp_path.glob("*.part"))


def test_a_backup_of_an_older_schema_restores_then_upgrades(
    db_url, fresh_url, tmp_path, monkeypatch, capsys
):
    upgrade(db_url, "0003")
    execute(db_url, old_run(step=4))
    file = tmp_path / "old.dump"
    assert eslab(monkeypatch, capsys, db_url, "backup", str(file))[0] == 0

    code, out, err = eslab(monkeypatch, capsys, fresh_url, "restore", str(file))
    assert code == 0, err
    assert "migration 0003 (latest 0005)" in out
    assert "warning:" in err and "eslab db upgrade" in err
    assert eslab(monkeypatch, capsys, fresh_url, "upgrade")[0] == 0
    restored = Store(fresh_url)
    assert restored.get_run("u-1").step == 4
    restored.close()


# -- bad input ---------------------------------------------------------------------------------


def test_backup_refuses_to_replace_a_file_or_the_database(
    sqlite_filled, sqlite_url, tmp_path, monkeypatch, capsys
):
    file = tmp_path / "backup.db"
    file.write_text("an older backup")
    code, _, err = eslab(monkeypatch, capsys, sqlite_url, "backup", str(file))
    assert code == 2 and f"backup file {file} exists; pass --force" in err
    assert file.read_text() == "an older backup"
    assert eslab(monkeypatch, capsys, sqlite_url, "backup", "--force", str(file))[0] == 0
    assert file.read_bytes().startswith(SQLITE_HEADER)

    database = sqlite_url.removeprefix("sqlite:///")
    code, _, err = eslab(monkeypatch, capsys, sqlite_url, "backup", "--force", database)
    assert code == 2 and "is the database itself" in err
    missing = tmp_path / "no-such-folder" / "b.db"
    code, _, err = eslab(monkeypatch, capsys, sqlite_url, "backup", str(missing))
    assert code == 2 and f"the folder {missing.parent} is missing" in err


@pytest.mark.parametrize("kind", ["missing", "text", "other kind", "truncated"])
def test_a_bad_backup_file_gets_one_line_naming_it(
    kind, filled, db_url, fresh_url, tmp_path, monkeypatch, capsys
):
    file = tmp_path / "bad.dump"
    sqlite = db_url.startswith("sqlite")
    if kind == "text":
        file.write_text("not a backup\n")
    elif kind == "other kind":
        file.write_bytes((b"PGDMP" if sqlite else SQLITE_HEADER) + bytes(4096))
    elif kind == "truncated":
        assert eslab(monkeypatch, capsys, db_url, "backup", str(file))[0] == 0
        file.write_bytes(file.read_bytes()[: file.stat().st_size * 2 // 3])
    expected = {
        "missing": "cannot read it (No such file or directory)",
        "text": "is not a backup of `eslab db backup`",
        "other kind": "which does not restore into the database",
        "truncated": "is damaged" if sqlite else "is not a whole pg_dump archive",
    }[kind]

    code, _, err = eslab(monkeypatch, capsys, fresh_url, "restore", str(file))
    assert code == 2
    assert str(file) in err and expected in err, err
    assert one_error_line(err)
    assert not list(tmp_path.glob("*.part"))
    # nothing of it was kept (PostgreSQL: pg_restore's one transaction rolled back)
    assert not set(contents(fresh_url)) & {"runs", "metrics"}


# -- passwords ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pg_with_password():
    try:
        server = PostgresServer(password=PASSWORD)
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        pytest.skip(f"PostgreSQL unavailable: {exc}")
    yield server
    server.stop()


def test_the_password_is_never_on_a_command_line_nor_printed(
    pg_with_password, tmp_path, monkeypatch, capsys
):
    url, fresh = pg_with_password.create_database(), pg_with_password.create_database()
    upgrade(url)
    store = Store(url)
    make_run(store, name="secret-keeper")
    store.close()
    monkeypatch.delenv("PGPASSWORD", raising=False)
    launched: list[tuple[list[str], int | None]] = []
    real_popen = subprocess.Popen

    def spy(args, *rest, **options):
        passfile = (options.get("env") or {}).get("PGPASSFILE")
        mode = stat.S_IMODE(os.stat(passfile).st_mode) if passfile else None
        launched.append(([str(arg) for arg in args], mode))
        return real_popen(args, *rest, **options)

    monkeypatch.setattr(backup.subprocess, "Popen", spy)
    file = tmp_path / "backup.dump"
    shown = []
    for database, argv in ((url, ("backup", str(file))), (fresh, ("restore", str(file)))):
        code, out, err = eslab(monkeypatch, capsys, database, *argv)
        assert code == 0, err
        shown += [out, err]
    assert run_names(fresh) == {"secret-keeper"}
    wrong = url.replace("pa%3Ass", "pa%3Axx")
    for argv in (("backup", str(tmp_path / "other.dump")), ("restore", "--force", str(file))):
        code, out, err = eslab(monkeypatch, capsys, wrong, *argv)
        assert code == 2 and "password authentication failed" in err
        assert one_error_line(err)
        shown += [out, err]

    connecting = [mode for args, mode in launched if any("--dbname" in a for a in args)]
    assert len(connecting) == 3 and all(mode == 0o600 for mode in connecting)
    secrets = (PASSWORD, "pa%3Ass", "pa:ss")
    for text_shown in shown + [" ".join(args) for args, _ in launched]:
        assert not any(secret in text_shown for secret in secrets), text_shown
