"""The worker (`python -m jobs.worker RUN_ID`) as a process of its own, without Ray: the run's
status, the database writes, SIGTERM, cancel, errors and resume. The trainer is the
stand-in of tests/jobs/standin.py, so each test takes a second or two."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from engine.paths import PROJECT_ROOT
from jobs import phases
from jobs.outcome import RunOutcome
from jobs.store.status import RunStatus
from jobs.worker import Worker
from tests.jobs import standin
from tests.jobs.helpers import STANDIN, queue_run, wait_for

STEP_SECONDS = "0.15"


def start_worker(sqlite_url, run_id, train="train", attempt=None, **env):
    environ = {
        **os.environ,
        "ESLAB_DATABASE_URL": sqlite_url,
        "PYTHONPATH": str(PROJECT_ROOT),
        "ESLAB_HEARTBEAT_S": "0.3",
        "ESLAB_STANDIN_STEP_S": STEP_SECONDS,
        **env,
    }
    command = [sys.executable, "-m", "jobs.worker", str(run_id), "--train", f"{STANDIN}:{train}"]
    return subprocess.Popen(
        command + (["--attempt", attempt] if attempt else []),
        env=environ,
        cwd="/",
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def finish(process, timeout=30):
    out, _ = process.communicate(timeout=timeout)
    return process.returncode, out


def step_of(store, run_id):
    return store.get_run(run_id).step


def test_a_run_succeeds_with_every_step_in_the_database(sqlite_store, sqlite_url, tmp_path):
    run = queue_run(sqlite_store, tmp_path / "out")
    code, out = finish(start_worker(sqlite_url, run.id))
    assert code == 0, out
    done = sqlite_store.get_run(run.id)
    assert done.status is RunStatus.SUCCEEDED and done.step == 6
    assert done.started_at <= done.finished_at and done.heartbeat_at is not None
    series = sqlite_store.metric_series(run.id, "train/reward/mean")
    assert [(p.step, p.value) for p in series] == [(s, -float(s)) for s in range(1, 7)]
    assert [p["member"] for p in sqlite_store.population(run.id, 6)] == [0, 1, 2, 3]
    assert len(sqlite_store.samples(run.id, split="train", step=6)) == 2
    assert [c.step for c in sqlite_store.checkpoints(run.id)] == [2, 4, 6]
    assert json.loads((tmp_path / "out" / "final.json").read_text()) == {"global_step": 6}
    assert "succeeded; final model in" in sqlite_store.events(run.id)[-1].message


@pytest.mark.parametrize("train", ["train", "train_without_hook"])
def test_sigterm_finishes_the_step_then_ends_cancelled(sqlite_store, sqlite_url, tmp_path, train):
    run = queue_run(sqlite_store, tmp_path / "out", max_steps=40, save_steps=100)
    worker = start_worker(sqlite_url, run.id, train=train)
    wait_for(lambda: step_of(sqlite_store, run.id) >= 3, 20, "step 3")
    worker.send_signal(signal.SIGTERM)
    code, out = finish(worker)
    assert code == 0, out
    stopped = sqlite_store.get_run(run.id)
    assert stopped.status is RunStatus.CANCELLED and stopped.error is None
    assert 3 <= stopped.step < 40
    steps = [p.step for p in sqlite_store.metric_series(run.id, "train/reward/mean")]
    assert steps == list(range(1, stopped.step + 1))  # the step in progress was finished
    checkpoints = [c.step for c in sqlite_store.checkpoints(run.id)]
    if train == "train":  # a trainer with the should_stop hook saves the stop step
        assert checkpoints == [stopped.step]
        assert (tmp_path / "out" / f"checkpoint-{stopped.step}").is_dir()
    else:
        assert checkpoints == []
    assert "SIGTERM received" in sqlite_store.events(run.id)[-1].message


def test_sigterm_under_rays_handler_still_ends_the_step_cancelled(
    sqlite_store, sqlite_url, tmp_path
):
    """ray.init replaces the worker's SIGTERM handler (engines in Ray actors): the worker
    takes it back at the step boundary, so a cancel still ends at the step with a checkpoint."""
    run = queue_run(sqlite_store, tmp_path / "out", max_steps=40, save_steps=100)
    worker = start_worker(sqlite_url, run.id, train="train_under_rays_handler")
    wait_for(lambda: step_of(sqlite_store, run.id) >= 2, 20, "step 2")
    worker.send_signal(signal.SIGTERM)
    code, out = finish(worker)
    assert code == 0, out
    stopped = sqlite_store.get_run(run.id)
    assert stopped.status is RunStatus.CANCELLED and stopped.error is None
    assert [c.step for c in sqlite_store.checkpoints(run.id)] == [stopped.step]
    assert "SIGTERM received" in sqlite_store.events(run.id)[-1].message


def test_sigterm_to_rays_handler_before_a_step_ends_the_run_cancelled(
    sqlite_store, sqlite_url, tmp_path
):
    """A SIGTERM that Ray's handler turns into an exit, before the worker took its handler
    back: the run is cancelled, not failed with "SystemExit: 15"."""
    run = queue_run(sqlite_store, tmp_path / "out", max_steps=3)
    worker = start_worker(
        sqlite_url, run.id, train="train_under_rays_handler", ESLAB_STANDIN_STEP_S="60"
    )
    wait_for(lambda: any("pid" in e.message for e in sqlite_store.events(run.id)), 20, "start")
    worker.send_signal(signal.SIGTERM)
    code, out = finish(worker)
    assert code == 0, out
    stopped = sqlite_store.get_run(run.id)
    assert stopped.status is RunStatus.CANCELLED and stopped.error is None
    assert "SIGTERM received" in sqlite_store.events(run.id)[-1].message


def test_a_cancel_in_the_database_stops_the_worker_with_a_checkpoint(
    sqlite_store, sqlite_url, tmp_path
):
    run = queue_run(sqlite_store, tmp_path / "out", max_steps=40, save_steps=100)
    worker = start_worker(sqlite_url, run.id)
    wait_for(lambda: step_of(sqlite_store, run.id) >= 2, 20, "step 2")
    assert sqlite_store.request_cancel(run.id).status is RunStatus.CANCELLING
    code, out = finish(worker)
    assert code == 0, out
    stopped = sqlite_store.get_run(run.id)
    assert stopped.status is RunStatus.CANCELLED
    assert [c.step for c in sqlite_store.checkpoints(run.id)] == [stopped.step]
    assert "cancel requested" in sqlite_store.events(run.id)[-1].message


def test_a_step_that_outlasts_the_stop_is_abandoned(sqlite_store, sqlite_url, tmp_path):
    run = queue_run(sqlite_store, tmp_path / "out", max_steps=3)
    worker = start_worker(
        sqlite_url, run.id, ESLAB_STANDIN_STEP_S="60", ESLAB_ABANDON_AFTER_S="0.5"
    )
    wait_for(lambda: sqlite_store.events(run.id), 20, "the worker to start")
    worker.send_signal(signal.SIGTERM)
    code, out = finish(worker, timeout=15)
    assert code == 0, out
    stopped = sqlite_store.get_run(run.id)
    assert stopped.status is RunStatus.CANCELLED and stopped.step == 0
    assert "step abandoned" in sqlite_store.events(run.id)[-1].message


def test_a_reward_error_fails_the_run_with_its_traceback(sqlite_store, sqlite_url, tmp_path):
    run = queue_run(
        sqlite_store, tmp_path / "out", reward_func_path=f"{STANDIN}.reward_failing_at_step_3"
    )
    code, out = finish(start_worker(sqlite_url, run.id))
    assert code == 1
    assert "the scorer broke at step 3" in out  # in the job's log too
    failed = sqlite_store.get_run(run.id)
    assert failed.status is RunStatus.FAILED
    assert "Traceback" in failed.error and "ValueError: the scorer broke at step 3" in failed.error
    assert [p.step for p in sqlite_store.metric_series(run.id, "train/reward/mean")] == [1, 2]
    assert sqlite_store.events(run.id)[-1].level == "error"


def test_resume_continues_from_the_checkpoint_without_duplicates(
    sqlite_store, sqlite_url, tmp_path
):
    run = queue_run(sqlite_store, tmp_path / "out", max_steps=8, save_steps=2)
    worker = start_worker(sqlite_url, run.id)
    wait_for(lambda: step_of(sqlite_store, run.id) >= 5, 20, "step 5")
    worker.kill()  # no chance to record anything: the run stays "running"
    worker.wait()
    sqlite_store.finish_run(run.id, RunStatus.FAILED, error="worker killed")  # the scheduler
    last = sqlite_store.checkpoints(run.id)[-1].step
    assert last in (4, 6)

    sqlite_store.resume_run(run.id, last)
    code, out = finish(start_worker(sqlite_url, run.id))
    assert code == 0, out
    done = sqlite_store.get_run(run.id)
    assert done.status is RunStatus.SUCCEEDED and done.attempt == 2
    assert [p.step for p in sqlite_store.metric_series(run.id, "train/reward/mean")] == list(
        range(1, 9)
    )
    assert len(sqlite_store.samples(run.id, split="train", step=5)) == 2  # not 2 per attempt
    resumed_from = f"resumed from {tmp_path / 'out' / f'checkpoint-{last}'} at step {last}"
    assert resumed_from in [e.message for e in sqlite_store.events(run.id)]


def test_a_worker_for_a_run_cancelled_while_queued_does_nothing(sqlite_store, sqlite_url, tmp_path):
    run = queue_run(sqlite_store, tmp_path / "out")
    sqlite_store.request_cancel(run.id)
    code, out = finish(start_worker(sqlite_url, run.id))
    assert code == 0 and "nothing to do" in out
    assert sqlite_store.get_run(run.id).started_at is None
    assert sqlite_store.metric_series(run.id, "train/reward/mean") == []


def test_a_cancel_then_rays_sigterm_still_saves_the_checkpoint(sqlite_store, sqlite_url, tmp_path):
    """What a cancel looks like under Ray: the heartbeat sees it, then stop_job's SIGTERM
    arrives; the SIGTERM is not a second, abandoning, request."""
    run = queue_run(sqlite_store, tmp_path / "out", max_steps=40, save_steps=100)
    worker = start_worker(sqlite_url, run.id, ESLAB_STANDIN_STEP_S="0.6")
    wait_for(lambda: step_of(sqlite_store, run.id) >= 1, 20, "step 1")
    sqlite_store.request_cancel(run.id)
    time.sleep(0.5)  # one heartbeat (0.3 s) sees the cancel before the signal comes
    worker.send_signal(signal.SIGTERM)
    code, out = finish(worker)
    assert code == 0, out
    stopped = sqlite_store.get_run(run.id)
    assert stopped.status is RunStatus.CANCELLED
    assert [c.step for c in sqlite_store.checkpoints(run.id)] == [stopped.step]
    assert "abandoned" not in sqlite_store.events(run.id)[-1].message


def test_a_second_signal_abandons_the_step_at_once(sqlite_store, sqlite_url, tmp_path):
    run = queue_run(sqlite_store, tmp_path / "out", max_steps=3)
    worker = start_worker(sqlite_url, run.id, ESLAB_STANDIN_STEP_S="60")
    # The first heartbeat comes after the signal handlers are installed.
    wait_for(lambda: sqlite_store.get_run(run.id).heartbeat_at, 20, "the worker to start")
    worker.send_signal(signal.SIGTERM)
    time.sleep(0.5)  # two signals sent at once may be handled in either order
    worker.send_signal(signal.SIGINT)
    code, out = finish(worker, timeout=30)  # far less than the 60 s step: it was abandoned
    assert code == 0, out
    assert sqlite_store.get_run(run.id).status is RunStatus.CANCELLED
    assert "step abandoned (a second signal, SIGINT)" in sqlite_store.events(run.id)[-1].message


def test_the_first_outcome_recorded_stands(sqlite_store, tmp_path):
    run = queue_run(sqlite_store, tmp_path / "out")
    assert sqlite_store.start_run(run.id)
    outcome = RunOutcome(sqlite_store, run.id, run.attempt)
    outcome.succeeded(tmp_path / "out")
    outcome.cancelled("too late")
    assert sqlite_store.get_run(run.id).status is RunStatus.SUCCEEDED
    assert [e.message for e in sqlite_store.events(run.id)] == [
        f"succeeded; final model in {tmp_path / 'out'}"
    ]


def test_a_cancel_as_the_last_step_ended_ends_the_run_cancelled(sqlite_store, tmp_path):
    run = queue_run(sqlite_store, tmp_path / "out")
    assert sqlite_store.start_run(run.id)
    sqlite_store.request_cancel(run.id)
    RunOutcome(sqlite_store, run.id, run.attempt).succeeded(tmp_path / "out")
    assert sqlite_store.get_run(run.id).status is RunStatus.CANCELLED
    assert sqlite_store.events(run.id)[-1].message.startswith("the cancel came as the last step")


def freeze_outside_a_write(worker: subprocess.Popen, database: Path) -> None:
    """SIGSTOP the worker at a moment it holds no write lock on the SQLite database: frozen
    inside a heartbeat's transaction, it would keep every other writer out (a CI run caught
    it there, and the test's own writes then timed out on "database is locked")."""
    for _ in range(100):
        os.kill(worker.pid, signal.SIGSTOP)
        probe = sqlite3.connect(database, timeout=0.2)
        try:
            probe.execute("BEGIN IMMEDIATE")
            probe.rollback()
            return
        except sqlite3.OperationalError:
            os.kill(worker.pid, signal.SIGCONT)  # let it finish its write, and try again
            time.sleep(0.05)
        finally:
            probe.close()
    raise AssertionError("the worker held the database's write lock at every try")


def test_a_worker_whose_run_was_resumed_stops_and_writes_nothing(
    sqlite_store, sqlite_url, tmp_path
):
    """A worker given up for dead (the scheduler failed the run) but only frozen, whose run
    was then resumed: the heartbeat of attempt 1 is refused and the worker exits at once,
    leaving attempt 2 as the resume made it. The worker is really frozen (SIGSTOP) while the
    run fails and resumes, so its heartbeat never falls between the two."""
    run = queue_run(sqlite_store, tmp_path / "out", max_steps=40, save_steps=2)
    worker = start_worker(sqlite_url, run.id, ESLAB_STANDIN_STEP_S="2")
    wait_for(lambda: step_of(sqlite_store, run.id) >= 1, 20, "step 1")
    freeze_outside_a_write(worker, tmp_path / "eslab.db")
    try:
        assert sqlite_store.finish_run(run.id, RunStatus.FAILED, error="no heartbeat", attempt=1)
        resumed = sqlite_store.resume_run(run.id, 0)
    finally:
        os.kill(worker.pid, signal.SIGCONT)
    code, out = finish(worker, timeout=15)  # far less than the rest of its step
    assert code == 1
    assert f"run {run.id}: attempt 1 may no longer write: the run was resumed as attempt 2" in out
    assert "this worker stops now and records nothing" in out
    assert sqlite_store.get_run(run.id) == resumed
    assert sqlite_store.metric_series(run.id, "train/reward/mean") == []
    assert not (tmp_path / "out" / "checkpoint-2").exists()  # it stopped within step 2


def test_a_late_job_of_an_earlier_attempt_leaves_the_run_alone(sqlite_store, sqlite_url, tmp_path):
    run = queue_run(sqlite_store, tmp_path / "out")
    sqlite_store.request_cancel(run.id)  # while its Ray job was pending
    sqlite_store.resume_run(run.id, 0)
    code, out = finish(start_worker(sqlite_url, run.id, attempt="1"))
    assert code == 0 and "nothing to do" in out
    assert sqlite_store.get_run(run.id).status is RunStatus.QUEUED
    code, out = finish(start_worker(sqlite_url, run.id, attempt="2"))
    assert code == 0, out
    assert sqlite_store.get_run(run.id).status is RunStatus.SUCCEEDED


@pytest.mark.parametrize("attempt", ["0", "-1", "1.5", "two"])
def test_an_attempt_that_is_not_a_whole_number_from_1_is_refused(sqlite_store, sqlite_url, attempt):
    code, out = finish(start_worker(sqlite_url, 1, attempt=attempt))
    assert code == 2
    assert f"argument --attempt: must be a whole number from 1, got '{attempt}'" in out


def test_the_engine_start_is_a_phase_of_the_run(sqlite_store, tmp_path):
    """While the engine starts, the run's events say so (the dashboard's "starting engine"),
    and once it is up, how long it took; the engine is a stand-in that waits for the test."""
    run = queue_run(sqlite_store, tmp_path / "out")
    release = threading.Event()

    class StandInPool:
        def devices(self) -> list[str]:
            return ["here/cpu (a stand-in)"]

        def shutdown(self) -> None:
            pass

    def start_pool(config, sink):
        assert release.wait(10)
        return StandInPool()

    def train_with_pool(config, sink, *, pool=None, resume_from=None):
        return standin.train(config, sink, resume_from=resume_from)

    worker = Worker(
        sqlite_store, run.id, train=train_with_pool, heartbeat_seconds=0.2, start_pool=start_pool
    )
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        phase = wait_for(
            lambda: phases.phase_of(sqlite_store, sqlite_store.get_run(run.id)),
            timeout=10,
            what="the starting engine phase",
        )
        assert phase.name == phases.STARTING_ENGINE and phase.seconds() < 10
        assert sqlite_store.get_run(run.id).step == 0
    finally:
        release.set()
        thread.join(30)
    assert sqlite_store.get_run(run.id).status is RunStatus.SUCCEEDED
    messages = [e.message for e in sqlite_store.events(run.id)]
    assert messages[0] == phases.STARTING_ENGINE
    assert messages[1].startswith("engine started in ")
    assert messages[1].endswith(" s on here/cpu (a stand-in)")
    assert phases.phase_of(sqlite_store, sqlite_store.get_run(run.id)) is None
