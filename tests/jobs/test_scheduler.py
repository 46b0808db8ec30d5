"""The scheduler with real Ray jobs, a real SQLite file and the real worker process (the
trainer is the stand-in of tests/jobs/standin.py): queueing, concurrency, cancelling, dead
jobs and heartbeats, resume, restarts and one scheduler per database.
tests/jobs/test_end_to_end.py repeats the main ones with the real engine."""

from __future__ import annotations

import os
import shlex
import signal
import sqlite3
import sys
import time

import pytest
from sqlalchemy.engine import make_url

from jobs.ray_jobs import JobState, RayJobs
from jobs.scheduler import Scheduler, SchedulerSettings, submission_id
from jobs.store.status import RunStatus
from tests.jobs.helpers import STANDIN, queue_run, wait_for, worker_pid

pytestmark = pytest.mark.heavy

SETTINGS = SchedulerSettings(
    max_concurrent_runs=2,
    tick_seconds=0.3,
    heartbeat_seconds=0.3,
    heartbeat_timeout_seconds=10.0,
    stop_wait_seconds=5.0,
    lock_lease_seconds=5.0,
)


def standin_entrypoint(run):
    return f"{shlex.quote(sys.executable)} -m jobs.worker {run.id} --train {STANDIN}:train"


@pytest.fixture
def make_scheduler(sqlite_store, ray_address):
    made: list[Scheduler] = []

    def make(step_seconds="0.2", entrypoint=standin_entrypoint, env=None, **settings):
        scheduler = Scheduler(
            sqlite_store,
            RayJobs(ray_address),
            SchedulerSettings(**{**SETTINGS.__dict__, **settings}),
            entrypoint=entrypoint,
            job_env={"ESLAB_STANDIN_STEP_S": step_seconds, **(env or {})},
        )
        made.append(scheduler)
        return scheduler

    yield make
    for scheduler in made:
        scheduler.shutdown()
    jobs = RayJobs(ray_address)
    for run in sqlite_store.active_runs():  # leave no job running into the next test
        jobs.stop(run.ray_submission_id)


def status(store, run_id):
    return store.get_run(run_id).status


def test_a_queued_run_runs_as_a_ray_job_to_success(
    make_scheduler, sqlite_store, tmp_path, ray_address
):
    run = queue_run(sqlite_store, tmp_path / "out")
    assert make_scheduler().start()
    done = wait_for(
        lambda: (r := sqlite_store.get_run(run.id)).status.is_terminal() and r, 60, "the run to end"
    )
    assert done.status is RunStatus.SUCCEEDED, done.error
    assert done.ray_submission_id == run.uuid  # submission id = the run's uuid
    assert RayJobs(ray_address).state(run.uuid) in (JobState.RUNNING, JobState.SUCCEEDED)
    assert [p.step for p in sqlite_store.metric_series(run.id, "train/reward/mean")] == [
        1,
        2,
        3,
        4,
        5,
        6,
    ]
    assert len(sqlite_store.population(run.id, 3)) == 4
    assert len(sqlite_store.samples(run.id, split="train", step=6)) == 2
    messages = [e.message for e in sqlite_store.events(run.id)]
    assert f"Ray job {run.uuid} submitted (attempt 1)" in messages


def test_at_most_max_concurrent_runs_start_oldest_first(make_scheduler, sqlite_store, tmp_path):
    runs = [
        queue_run(sqlite_store, tmp_path / f"out{i}", name=f"r{i}", max_steps=200) for i in range(3)
    ]
    scheduler = make_scheduler(max_concurrent_runs=2)
    assert scheduler.start()
    wait_for(
        lambda: all(status(sqlite_store, r.id) is RunStatus.RUNNING for r in runs[:2]),
        60,
        "the two oldest runs to run",
    )
    scheduler.tick()
    third = sqlite_store.get_run(runs[2].id)
    assert third.status is RunStatus.QUEUED and third.ray_submission_id is None
    sqlite_store.request_cancel(runs[0].id)  # a slot frees up: the third starts
    wait_for(lambda: status(sqlite_store, runs[2].id) is RunStatus.RUNNING, 60, "the third")


def test_two_runs_at_once_write_without_database_locked_errors(
    make_scheduler, sqlite_store, tmp_path, sqlite_url
):
    runs = [
        queue_run(
            sqlite_store,
            tmp_path / f"out{i}",
            name=f"r{i}",
            max_steps=150,
            population_size=32,
            save_steps=25,
        )
        for i in range(2)
    ]
    # Both start their steps together, so they overlap even where Ray starts one late.
    barrier = {"ESLAB_STANDIN_BARRIER": f"{tmp_path / 'barrier'}:2"}
    assert make_scheduler(step_seconds="0", env=barrier).start()
    ended = wait_for(
        lambda: all(status(sqlite_store, r.id).is_terminal() for r in runs), 120, "both runs to end"
    )
    assert ended
    for run in runs:
        done = sqlite_store.get_run(run.id)
        assert done.status is RunStatus.SUCCEEDED, done.error
        steps = [p.step for p in sqlite_store.metric_series(run.id, "train/reward/mean")]
        assert steps == list(range(1, 151))
        assert len(sqlite_store.population(run.id, 150)) == 32
    first, second = (sqlite_store.get_run(r.id) for r in runs)
    assert second.started_at < first.finished_at  # they did overlap
    path = make_url(sqlite_url).database
    assert sqlite3.connect(path).execute("PRAGMA integrity_check").fetchone() == ("ok",)


@pytest.mark.parametrize(
    ("heartbeat", "ends_as"),
    [
        # The worker's heartbeat may see the cancel before Ray's stop_job (SIGTERM) arrives
        # (a stop_job that crosses that exit reads STOPPED: RayJobs.state).
        (0.3, {JobState.SUCCEEDED, JobState.STOPPED}),
        (30.0, {JobState.STOPPED}),  # only Ray's stop_job can stop it in time
    ],
)
def test_cancel_stops_the_ray_job_and_cancels_the_run_within_15_s(
    make_scheduler, sqlite_store, tmp_path, ray_address, heartbeat, ends_as
):
    run = queue_run(sqlite_store, tmp_path / "out", max_steps=500, save_steps=1000)
    assert make_scheduler(heartbeat_seconds=heartbeat, heartbeat_timeout_seconds=60.0).start()
    wait_for(lambda: sqlite_store.get_run(run.id).step >= 2, 60, "step 2")
    asked = time.monotonic()
    sqlite_store.request_cancel(run.id)
    jobs = RayJobs(ray_address)
    wait_for(
        lambda: (
            status(sqlite_store, run.id) is RunStatus.CANCELLED
            and jobs.state(run.uuid).is_terminal()
        ),
        15,
        "the run to be cancelled",
    )
    assert time.monotonic() - asked < 15
    assert jobs.state(run.uuid) in ends_as
    stopped = sqlite_store.get_run(run.id)
    assert [c.step for c in sqlite_store.checkpoints(run.id)] == [stopped.step]


def test_kill_9_fails_the_run_then_resume_completes_it(
    make_scheduler, sqlite_store, tmp_path, sqlite_url
):
    run = queue_run(sqlite_store, tmp_path / "out", max_steps=16, save_steps=3)
    assert make_scheduler(heartbeat_timeout_seconds=10.0).start()
    wait_for(lambda: sqlite_store.get_run(run.id).step >= 7, 60, "step 7")
    os.kill(worker_pid(sqlite_store, run.id), signal.SIGKILL)
    killed_at = time.monotonic()
    failed = wait_for(
        lambda: (r := sqlite_store.get_run(run.id)).status.is_terminal() and r,
        10,
        "the run to be failed within the heartbeat timeout",
    )
    assert time.monotonic() - killed_at < 10
    assert failed.status is RunStatus.FAILED
    assert "FAILED" in failed.error or "failed" in failed.error
    assert "end of its log" in failed.error and "Running entrypoint" in failed.error
    assert "killed with SIGKILL, most often by the kernel's out-of-memory killer" in failed.error
    path = make_url(sqlite_url).database
    assert sqlite3.connect(path).execute("PRAGMA integrity_check").fetchone() == ("ok",)
    steps = [p.step for p in sqlite_store.metric_series(run.id, "train/reward/mean")]
    assert steps == list(range(1, failed.step + 1))  # every finished step is there

    checkpoint = sqlite_store.checkpoints(run.id)[-1].step
    resumed = sqlite_store.resume_run(run.id, checkpoint)
    done = wait_for(
        lambda: (r := sqlite_store.get_run(run.id)).status.is_terminal() and r,
        60,
        "the resumed run to end",
    )
    assert done.status is RunStatus.SUCCEEDED, done.error
    assert done.ray_submission_id == submission_id(resumed) == f"{run.uuid}-2"
    steps = [p.step for p in sqlite_store.metric_series(run.id, "train/reward/mean")]
    assert steps == list(range(1, 17))


def test_a_frozen_worker_fails_on_its_heartbeat_timeout(
    make_scheduler, sqlite_store, sqlite_url, tmp_path, ray_address
):
    run = queue_run(sqlite_store, tmp_path / "out", max_steps=500)
    assert make_scheduler(heartbeat_timeout_seconds=2.0, stop_wait_seconds=1.0).start()
    wait_for(lambda: sqlite_store.get_run(run.id).step >= 1, 60, "step 1")
    pid = worker_pid(sqlite_store, run.id)
    # Frozen between two writes: holding the write lock here for a moment makes sure of it.
    # (A worker frozen in the middle of a write is
    # tests/jobs/test_scheduler_database_lock.py.)
    between_writes = sqlite3.connect(make_url(sqlite_url).database, isolation_level=None)
    between_writes.execute("BEGIN IMMEDIATE")
    os.kill(pid, signal.SIGSTOP)  # alive for Ray, silent for the database
    between_writes.execute("ROLLBACK")
    between_writes.close()
    try:
        failed = wait_for(
            lambda: (r := sqlite_store.get_run(run.id)).status.is_terminal() and r,
            15,
            "the heartbeat timeout",
        )
    finally:
        os.kill(pid, signal.SIGCONT) if _alive(pid) else None
    assert failed.status is RunStatus.FAILED and "no heartbeat" in failed.error
    jobs = RayJobs(ray_address)
    wait_for(lambda: jobs.state(run.uuid).is_terminal(), 15, "its job to be stopped")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


def test_restarting_the_scheduler_keeps_a_running_run_true(make_scheduler, sqlite_store, tmp_path):
    run = queue_run(sqlite_store, tmp_path / "out", max_steps=40)
    first = make_scheduler()
    assert first.start()
    wait_for(lambda: sqlite_store.get_run(run.id).step >= 2, 60, "step 2")
    first.shutdown()
    second = make_scheduler()
    assert second.start()  # the first released its lock on shutdown
    seen = set()
    while not (current := status(sqlite_store, run.id)).is_terminal():
        seen.add(current)
        time.sleep(0.2)
    assert seen == {RunStatus.RUNNING}
    assert current is RunStatus.SUCCEEDED, sqlite_store.get_run(run.id).error


def test_a_second_scheduler_on_the_same_database_is_refused(make_scheduler):
    first, second = make_scheduler(), make_scheduler()
    assert first.start()
    assert not second.start() and not second.running
    assert first.owner in second.holder_message()
    first.shutdown()
    assert second.start()


def test_a_job_that_dies_before_its_worker_starts_fails_with_its_log(
    make_scheduler, sqlite_store, tmp_path
):
    run = queue_run(sqlite_store, tmp_path / "out")
    crash = f"{shlex.quote(sys.executable)} -c \"print('no worker here'); raise SystemExit(3)\""
    assert make_scheduler(entrypoint=lambda _run: crash).start()
    failed = wait_for(
        lambda: (r := sqlite_store.get_run(run.id)).status.is_terminal() and r,
        60,
        "the run to fail",
    )
    assert failed.status is RunStatus.FAILED
    assert "no worker here" in failed.error and failed.error.startswith("the worker's Ray job")


def test_a_submission_lost_with_its_ray_cluster_is_submitted_again(
    make_scheduler, sqlite_store, tmp_path
):
    run = queue_run(sqlite_store, tmp_path / "out", max_steps=2)
    sqlite_store.mark_submitted(run.id, "a-job-of-a-cluster-that-is-gone")
    scheduler = make_scheduler()
    scheduler.tick()  # no lock yet: this tick takes it
    scheduler.tick()
    assert sqlite_store.get_run(run.id).ray_submission_id == run.uuid


def test_a_database_password_reaches_the_job_in_a_private_file_not_its_environment(monkeypatch):
    from jobs.scheduler import _database_env
    from jobs.store.database import database_url

    url = "postgresql+psycopg://eslab:s3cret@db.example:5432/eslab"
    env = _database_env(make_url(url))
    assert "s3cret" not in "".join(env.values()) and env["ESLAB_DATABASE_URL"] == ""
    path = env["ESLAB_DATABASE_URL_FILE"]
    assert os.stat(path).st_mode & 0o077 == 0  # only this user can read it
    monkeypatch.setenv("ESLAB_DATABASE_URL", "")
    monkeypatch.setenv("ESLAB_DATABASE_URL_FILE", path)
    assert database_url() == url  # what the worker connects to

    sqlite = _database_env(make_url("sqlite:///relative/eslab.db"))
    assert sqlite == {"ESLAB_DATABASE_URL": f"sqlite:///{os.path.abspath('relative/eslab.db')}"}
