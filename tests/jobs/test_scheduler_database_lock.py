"""A worker frozen in the middle of a write holds SQLite's write lock: the scheduler can
write nothing (not even its own lock) until that worker is gone, so it must stop the
worker's Ray job using reads alone. Ray is a recording stand-in here, because the moment
of the freeze must be exact; tests/jobs/test_scheduler.py freezes a real worker under real
Ray."""

from __future__ import annotations

import sqlite3
import threading
import time

from sqlalchemy.engine import make_url

from jobs.scheduler import Scheduler, SchedulerSettings
from jobs.store.status import RunStatus
from tests.jobs.helpers import RecordingRay, queue_run, wait_for


def test_a_worker_frozen_while_writing_is_stopped_before_the_scheduler_writes(
    sqlite_store, sqlite_url, tmp_path
):
    run = queue_run(sqlite_store, tmp_path / "out")
    assert sqlite_store.mark_submitted(run.id, run.uuid) and sqlite_store.start_run(run.id)
    ray = RecordingRay()
    scheduler = Scheduler(sqlite_store, ray, SchedulerSettings(heartbeat_timeout_seconds=0.5))
    scheduler.tick()  # takes the scheduler lock while the worker is still fresh
    assert ray.stopped == [] and sqlite_store.get_run(run.id).status is RunStatus.RUNNING

    time.sleep(0.6)
    frozen_writer = sqlite3.connect(make_url(sqlite_url).database, isolation_level=None)
    frozen_writer.execute("BEGIN IMMEDIATE")  # the write the worker froze in
    ticking = threading.Thread(target=scheduler.tick)
    ticking.start()
    try:
        wait_for(lambda: ray.stopped == [run.uuid], 5, "the silent worker's job to be stopped")
        assert ticking.is_alive()  # still waiting for the database, as it must
        assert sqlite_store.get_run(run.id).status is RunStatus.RUNNING
    finally:
        frozen_writer.execute("ROLLBACK")  # Ray killed the worker: its lock is released
        frozen_writer.close()
        ticking.join(35)

    failed = sqlite_store.get_run(run.id)
    assert failed.status is RunStatus.FAILED
    assert "no heartbeat" in failed.error and "the worker's last words" in failed.error
    scheduler.tick()
    assert ray.stopped == [run.uuid]  # stopped once, failed once
    assert [e.message for e in sqlite_store.events(run.id)].count(
        "scheduler marked the run failed: heartbeat timeout"
    ) == 1


def test_a_database_held_by_another_process_is_waited_out_not_blamed_on_the_workers(
    sqlite_url, tmp_path, monkeypatch
):
    """Another process holds SQLite's write lock (a backup, a `sqlite3` shell): the workers
    wait for it (jobs.sink), so while the scheduler cannot write either, their silence is
    not theirs, up to ESLAB_DB_WAIT_S; silence counts again from when the database is back."""
    from jobs.store import database
    from jobs.store.store import Store

    monkeypatch.setattr(database, "BUSY_TIMEOUT_MS", 300)  # the lock is seen at once
    monkeypatch.setenv("ESLAB_DB_WAIT_S", "60")
    store = Store(sqlite_url)
    try:
        run = queue_run(store, tmp_path / "out")
        assert store.mark_submitted(run.id, run.uuid) and store.start_run(run.id)
        ray = RecordingRay()
        scheduler = Scheduler(store, ray, SchedulerSettings(heartbeat_timeout_seconds=0.5))
        scheduler.tick()
        holder = sqlite3.connect(make_url(sqlite_url).database, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        try:
            scheduler.tick()  # the worker is still fresh; the lock renewal is refused
            time.sleep(1.0)
            scheduler.tick()  # silent for 1 s > 0.5, but nobody can write
            assert ray.stopped == []
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        scheduler.tick()  # the database is back: silence counts from now
        scheduler.tick()
        assert ray.stopped == [] and store.get_run(run.id).status is RunStatus.RUNNING
        time.sleep(1.0)
        scheduler.tick()  # and a worker that stays silent is stopped as before
        assert ray.stopped == [run.uuid]
    finally:
        store.close()
