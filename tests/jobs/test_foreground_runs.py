"""Foreground runs (`eslab train`: no Ray job) that lose their process: the scheduler of
`eslab serve` ends them by the heartbeat timeout, as it does Ray jobs' runs (failed, or
cancelled when a cancel was waiting), and never pretends to stop a process it does not own;
a process that lives on after that stops itself at its next write; and without a scheduler,
`eslab runs` marks such a run stale. Ray is a recording stand-in: these runs never reach it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import yaml

from app.cli import main
from engine.data.datasets import Example, write_dataset
from engine.paths import PROJECT_ROOT
from jobs.scheduler import Scheduler, SchedulerSettings
from jobs.store.status import RunStatus
from tests.jobs.helpers import STANDIN, RecordingRay, standin_config, wait_for

TIMEOUT_S = 3.0


def foreground_run(store, tmp_path):
    """A run as `eslab train` stores it (jobs.runner): running from the start, no Ray job."""
    config = standin_config(tmp_path / "out")
    return store.create_run(
        name="fg", method="es", config=config.to_flat(), status=RunStatus.RUNNING
    )


def scheduler_for(store):
    ray = RecordingRay()
    return Scheduler(store, ray, SchedulerSettings(heartbeat_timeout_seconds=TIMEOUT_S)), ray


def tick_until(scheduler, store, run_id, status, timeout=15):
    def ended():
        scheduler.tick()
        return store.get_run(run_id).status is status

    wait_for(ended, timeout, f"the scheduler to mark run {run_id} {status.value}", interval=0.3)


def test_a_silent_foreground_run_fails_by_the_heartbeat_timeout(sqlite_store, tmp_path):
    run = foreground_run(sqlite_store, tmp_path)
    scheduler, ray = scheduler_for(sqlite_store)
    scheduler.tick()  # takes the lock; the run is young
    assert sqlite_store.get_run(run.id).status is RunStatus.RUNNING

    time.sleep(TIMEOUT_S + 0.2)
    scheduler.tick()
    failed = sqlite_store.get_run(run.id)
    assert failed.status is RunStatus.FAILED
    assert "no heartbeat from its foreground `eslab train` process" in failed.error
    assert "not the scheduler's to stop" in failed.error
    assert ray.stopped == []  # there was no job to stop, and nothing else was tried
    assert sqlite_store.events(run.id)[-1].message == (
        "scheduler marked the run failed: heartbeat timeout"
    )


def test_a_beating_foreground_run_is_left_to_its_process(sqlite_store, tmp_path):
    run = foreground_run(sqlite_store, tmp_path)
    scheduler, _ = scheduler_for(sqlite_store)
    for _ in range(4):
        sqlite_store.beat(run.id, attempt=run.attempt)
        scheduler.tick()
        time.sleep(TIMEOUT_S / 2)
    assert sqlite_store.get_run(run.id).status is RunStatus.RUNNING


def test_a_cancel_whose_foreground_process_is_gone_ends_cancelled(
    sqlite_store, sqlite_url, tmp_path, monkeypatch, capsys
):
    run = foreground_run(sqlite_store, tmp_path)
    scheduler, ray = scheduler_for(sqlite_store)
    scheduler.tick()
    monkeypatch.setenv("ESLAB_DATABASE_URL", sqlite_url)
    assert main(["cancel", str(run.id)]) == 0
    said = capsys.readouterr().out
    assert "its `eslab train` process finishes the current step" in said
    assert "if that process is gone, `eslab serve` ends it cancelled" in said
    scheduler.tick()
    assert sqlite_store.get_run(run.id).status is RunStatus.CANCELLING  # its process may stop it

    time.sleep(TIMEOUT_S + 0.2)
    scheduler.tick()
    cancelled = sqlite_store.get_run(run.id)
    assert cancelled.status is RunStatus.CANCELLED and cancelled.error is None
    assert ray.stopped == []
    last = sqlite_store.events(run.id)[-1].message
    assert last.startswith("scheduler marked the run cancelled: no heartbeat from its foreground")


def test_eslab_runs_marks_a_silent_run_stale(
    sqlite_store, sqlite_url, tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("ESLAB_DATABASE_URL", sqlite_url)
    monkeypatch.setenv("ESLAB_HEARTBEAT_TIMEOUT_S", str(TIMEOUT_S))
    silent = foreground_run(sqlite_store, tmp_path)
    time.sleep(TIMEOUT_S + 0.2)
    beating = foreground_run(sqlite_store, tmp_path)
    assert main(["runs"]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    assert "running (stale: no heartbeat for " in lines[str(silent.id)]
    assert "stale" not in lines[str(beating.id)] and " running " in lines[str(beating.id)]


def test_eslab_runs_refuses_a_malformed_timeout_in_one_line(sqlite_url, monkeypatch, capsys):
    monkeypatch.setenv("ESLAB_DATABASE_URL", sqlite_url)
    monkeypatch.setenv("ESLAB_HEARTBEAT_TIMEOUT_S", "-1")
    assert main(["runs"]) == 2
    assert capsys.readouterr().err == (
        "eslab: error: ESLAB_HEARTBEAT_TIMEOUT_S must be a finite number above 0, got '-1'\n"
    )


# -- a real `eslab train` process ----------------------------------------------------------


def start_eslab_train(sqlite_url, tmp_path):
    """`eslab train` of the stand-in trainer (ESLAB_WORKER_TRAIN), 0.1 s a step."""
    train = write_dataset(
        [
            Example(prompt=[{"role": "user", "content": f"say {i}"}], reward_func_args={})
            for i in range(4)
        ],
        tmp_path / "train.parquet",
    )
    config = tmp_path / "run.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "method": "es",
                "train_file": str(train),
                "output_dir": str(tmp_path / "out"),
                "reward_func_path": f"{STANDIN}.reward",
                "population_size": 4,
                "max_steps": 500,
                "save_strategy": "steps",
                "save_steps": 2,
            }
        )
    )
    env = {
        **os.environ,
        "ESLAB_DATABASE_URL": sqlite_url,
        "PYTHONPATH": str(PROJECT_ROOT),
        "ESLAB_WORKER_TRAIN": f"{STANDIN}:train",
        "ESLAB_STANDIN_STEP_S": "0.1",
    }
    return subprocess.Popen(
        [sys.executable, "-m", "app.cli", "train", str(config)],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def started_run(store, process):
    def training():
        assert process.poll() is None, process.communicate()[0]
        runs = store.list_runs()
        return runs and runs[0].step >= 2 and runs[0]

    return wait_for(training, 60, "`eslab train` to train two steps")


@pytest.mark.parametrize("cancel", [False, True], ids=["running", "cancelling"])
def test_a_killed_eslab_train_is_ended_by_the_scheduler(sqlite_store, sqlite_url, tmp_path, cancel):
    process = start_eslab_train(sqlite_url, tmp_path)
    try:
        run = started_run(sqlite_store, process)
        scheduler, ray = scheduler_for(sqlite_store)
        scheduler.tick()
        if cancel:  # requested, then the process dies before its heartbeat notices
            sqlite_store.request_cancel(run.id)
        process.send_signal(signal.SIGKILL)
        process.wait(10)
        scheduler.tick()  # its heartbeat is still young: nothing yet
        assert sqlite_store.get_run(run.id).status in (RunStatus.RUNNING, RunStatus.CANCELLING)
    finally:
        process.kill()
        process.communicate()

    tick_until(
        scheduler,
        sqlite_store,
        run.id,
        RunStatus.CANCELLED if cancel else RunStatus.FAILED,
        timeout=TIMEOUT_S + 10,
    )
    ended = sqlite_store.get_run(run.id)
    assert ray.stopped == []
    assert (ended.error is None) if cancel else ("no heartbeat from its foreground" in ended.error)


def test_an_eslab_train_ended_by_the_scheduler_stops_itself(sqlite_store, sqlite_url, tmp_path):
    """The scheduler cannot stop a foreground process; if the run it failed (for a heartbeat
    silent while, say, the machine slept) still has a live process, that process's next
    write is refused and it exits, writing nothing more."""
    process = start_eslab_train(sqlite_url, tmp_path)
    try:
        run = started_run(sqlite_store, process)
        assert sqlite_store.finish_run(run.id, RunStatus.FAILED, error="no heartbeat (test)")
        out, _ = process.communicate(timeout=30)
    finally:
        process.kill()
    assert process.returncode == 1, out
    assert f"run {run.id}: attempt 1 may no longer write: the run is failed" in out
    ended = sqlite_store.get_run(run.id)
    assert ended.status is RunStatus.FAILED and ended.error == "no heartbeat (test)"
    time.sleep(0.3)  # three steps' time: nothing more arrives
    steps = [p.step for p in sqlite_store.metric_series(run.id, "train/reward/mean")]
    assert steps == list(range(1, ended.step + 1)) and sqlite_store.get_run(run.id) == ended
