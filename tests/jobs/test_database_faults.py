"""A run's writes when the database does not take them for a while (jobs.sink): SQLite held
by another process's transaction (a backup tool, a `sqlite3` shell) past the busy timeout,
and a PostgreSQL server restarted under the run. The run waits and goes on with no step lost
or doubled, or, past ESLAB_DB_WAIT_S, fails saying why, with the database intact."""

from __future__ import annotations

import sqlite3
import threading
import time

import pytest
from sqlalchemy.engine import make_url

from jobs.sink import DatabaseSink
from jobs.store import database
from jobs.store.errors import DatabaseUnavailableError
from jobs.store.records import RunRecord
from jobs.store.store import Store
from tests.jobs.test_store import make_run, step_report

HOLD_S = 3.0


@pytest.fixture
def quick_busy_timeout(monkeypatch):
    """SQLite's busy handler gives up after 0.3 s instead of 30, so that the sink's own
    retries are what waits out the lock."""
    monkeypatch.setattr(database, "BUSY_TIMEOUT_MS", 300)


def running(store: Store) -> RunRecord:
    run = make_run(store)
    assert store.start_run(run.id, attempt=run.attempt)
    return run


def held(path: str, seconds: float) -> threading.Thread:
    """Another process's write transaction on the file for `seconds` (as a `sqlite3` shell's
    BEGIN IMMEDIATE holds it)."""
    ready = threading.Event()

    def hold() -> None:
        connection = sqlite3.connect(path, isolation_level=None)
        connection.execute("BEGIN IMMEDIATE")
        ready.set()
        time.sleep(seconds)
        connection.execute("ROLLBACK")
        connection.close()

    thread = threading.Thread(target=hold)
    thread.start()
    ready.wait(10)
    return thread


def test_a_step_waits_for_a_database_another_process_holds(
    sqlite_url, quick_busy_timeout, monkeypatch, caplog
):
    monkeypatch.setenv("ESLAB_DB_WAIT_S", "60")
    store = Store(sqlite_url)
    try:
        run = running(store)
        sink = DatabaseSink(store, run.id, run.attempt)
        sink.log_step(step_report(1, reward=1.0))
        holder = held(make_url(sqlite_url).database, HOLD_S)
        started = time.monotonic()
        sink.log_step(step_report(2, reward=2.0))
        assert time.monotonic() - started >= HOLD_S - 0.5  # it waited for the lock to go
        holder.join()
        assert [p.step for p in store.metric_series(run.id, "train/reward/mean")] == [1, 2]
        assert len(store.samples(run.id, split="train", step=2)) == 1
        assert "trying again in" in caplog.text and "database is locked" in caplog.text
    finally:
        store.close()


def test_past_the_wait_the_write_fails_saying_so_and_loses_nothing(
    sqlite_url, quick_busy_timeout, monkeypatch
):
    monkeypatch.setenv("ESLAB_DB_WAIT_S", "1.5")
    store = Store(sqlite_url)
    try:
        run = running(store)
        sink = DatabaseSink(store, run.id, run.attempt)
        sink.log_step(step_report(1, reward=1.0))
        holder = held(make_url(sqlite_url).database, 6.0)
        with pytest.raises(DatabaseUnavailableError, match=r"waited 2 s \(ESLAB_DB_WAIT_S\)"):
            sink.log_step(step_report(2, reward=2.0))
        holder.join()
        assert [p.step for p in store.metric_series(run.id, "train/reward/mean")] == [1]
        path = make_url(sqlite_url).database
        assert sqlite3.connect(path).execute("PRAGMA integrity_check").fetchone() == ("ok",)
    finally:
        store.close()


def test_a_postgresql_restart_under_a_run_loses_no_step_and_doubles_none(postgres, monkeypatch):
    if isinstance(postgres, str):
        pytest.skip(postgres)
    from jobs.store.migrate import upgrade

    url = postgres.create_database()
    upgrade(url)
    monkeypatch.setenv("ESLAB_DB_WAIT_S", "60")
    store = Store(url)
    try:
        run = running(store)
        sink = DatabaseSink(store, run.id, run.attempt)
        sink.log_step(step_report(1, reward=1.0))
        postgres.shut_down()  # every connection of the pool is cut
        restart = threading.Timer(HOLD_S, postgres.start_again)
        restart.start()
        try:
            sink.log_step(step_report(2, reward=2.0))
            sink.heartbeat(2)
        finally:
            restart.join()
        sink.log_step(step_report(3, reward=3.0))
        assert [p.step for p in store.metric_series(run.id, "train/reward/mean")] == [1, 2, 3]
        assert [len(store.samples(run.id, split="train", step=s)) for s in (1, 2, 3)] == [1] * 3
    finally:
        store.close()


def test_a_commit_whose_answer_was_lost_is_not_written_twice(sqlite_url, monkeypatch):
    """The step went in, but the connection dropped before the answer came (what a server
    restart at the moment of COMMIT does): the retry finds it and writes nothing again."""
    monkeypatch.setenv("ESLAB_DB_WAIT_S", "30")
    store = Store(sqlite_url)
    try:
        run = running(store)
        sink = DatabaseSink(store, run.id, run.attempt)
        record = store.record_step
        calls = []

        def committed_then_lost(*args, **kwargs):
            calls.append(1)
            record(*args, **kwargs)
            if len(calls) == 1:
                raise DatabaseUnavailableError("server closed the connection unexpectedly")

        monkeypatch.setattr(store, "record_step", committed_then_lost)
        sink.log_step(step_report(1, reward=1.0))
        assert calls == [1]  # found recorded: not written again
        assert len(store.samples(run.id, split="train", step=1)) == 1
    finally:
        store.close()
