"""A new, empty database just works: the first process that opens it creates the schema,
even when several open it at once (`eslab serve` and a worker, two CLIs)."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

from sqlalchemy import inspect

from engine.paths import PROJECT_ROOT
from jobs.store.database import make_engine
from jobs.store.migrate import current_revision, head_revision

OPEN_WHEN_TOLD = """
import os, sys, time
from jobs.store.store import Store
open(sys.argv[2], "w").close()  # imported: ready
while not os.path.exists(sys.argv[3]):
    time.sleep(0.005)
Store(sys.argv[1]).close()
"""


def eslab(*args: str, url: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "ESLAB_DATABASE_URL": url}
    env.pop("ESLAB_DATABASE_URL_FILE", None)
    return subprocess.run(
        [sys.executable, "-m", "app.cli", *args],
        cwd=PROJECT_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def assert_at_head(url: str) -> None:
    engine = make_engine(url)
    assert current_revision(engine) == head_revision()
    assert {"runs", "metrics", "samples", "scheduler_lock"} <= set(
        inspect(engine).get_table_names()
    )
    engine.dispose()


def test_the_cli_creates_the_schema_of_a_new_database(db_url):
    listed = eslab("runs", url=db_url)
    assert listed.returncode == 0, listed.stderr
    assert_at_head(db_url)


def test_processes_that_open_a_new_database_at_once_all_succeed(db_url, tmp_path: Path):
    go = tmp_path / "go"
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", OPEN_WHEN_TOLD, db_url, str(tmp_path / f"ready-{i}"), str(go)],
            cwd=PROJECT_ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(3)
    ]
    deadline = time.monotonic() + 120
    while not all((tmp_path / f"ready-{i}").exists() for i in range(3)):
        assert time.monotonic() < deadline, "the processes did not start"
        time.sleep(0.05)
    go.touch()
    for process in processes:
        _, stderr = process.communicate(timeout=120)
        assert process.returncode == 0, stderr
    assert_at_head(db_url)


def test_a_new_database_that_another_process_writes_is_switched_to_wal_once_it_is_free(
    tmp_path: Path,
):
    """While another connection holds a write lock on a database in rollback mode, SQLite
    refuses the switch to WAL at once, busy timeout or not: the switch is retried."""
    path = tmp_path / "eslab.db"
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("CREATE TABLE t (i INTEGER)")
    holder.execute("BEGIN IMMEDIATE")
    holder.execute("INSERT INTO t VALUES (1)")
    release = threading.Timer(0.5, holder.execute, ["COMMIT"])
    release.start()
    try:
        with make_engine(f"sqlite:///{path}").connect() as connection:
            mode = connection.exec_driver_sql("PRAGMA journal_mode").scalar()
    finally:
        release.join()
        holder.close()
    assert mode == "wal"
