"""The real thing: the scheduler submits a run as a Ray job, the worker runs engine.trainer
on vLLM (CPU build, the default model) and streams into SQLite; a cancel stops it; a worker
killed with SIGKILL is resumed to the end, every step recorded once. Each run starts one vLLM
engine (about 30 s on the CPU), so one run is killed and resumed rather than one more run
trained straight to success."""

from __future__ import annotations

import time

import pytest

from jobs.ray_jobs import RayJobs
from jobs.scheduler import Scheduler, SchedulerSettings
from jobs.store.status import RunStatus
from tests.jobs.helpers import ended, queue_real_run, wait_for

pytestmark = pytest.mark.heavy

SETTINGS = SchedulerSettings(
    max_concurrent_runs=1,
    tick_seconds=0.5,
    heartbeat_seconds=1.0,
    heartbeat_timeout_seconds=120.0,
    stop_wait_seconds=20.0,
)


@pytest.fixture
def scheduler(sqlite_store, ray_address):
    scheduler = Scheduler(sqlite_store, RayJobs(ray_address), SETTINGS)
    assert scheduler.start()
    yield scheduler
    scheduler.shutdown()
    for run in sqlite_store.active_runs():
        RayJobs(ray_address).stop(run.ray_submission_id)


# From the cancel request to the run recorded cancelled and its Ray job ended: the member in
# flight finishes, a resume-only checkpoint (fp32 master + state) is saved, the outcome is
# recorded, and the worker exits without a graceful vLLM shutdown. Measured 11.2 s with the
# machine's 2 cores under a load average of 11.
CANCEL_BOUND_S = 15


def test_cancelling_a_real_run_stops_its_job_promptly(
    scheduler, sqlite_store, tmp_path, ray_address
):
    run = queue_real_run(sqlite_store, tmp_path, max_steps=40, save_steps=100)
    wait_for(lambda: sqlite_store.get_run(run.id).step >= 1, 400, "step 1", interval=1)
    asked = time.monotonic()
    sqlite_store.request_cancel(run.id)
    jobs = RayJobs(ray_address)
    wait_for(
        lambda: (
            sqlite_store.get_run(run.id).status is RunStatus.CANCELLED
            and jobs.state(run.uuid).is_terminal()
        ),
        CANCEL_BOUND_S,
        "the run to be cancelled",
    )
    print(f"cancelled in {time.monotonic() - asked:.1f} s")
    stopped = sqlite_store.get_run(run.id)
    assert 1 <= stopped.step < 40
    steps = [p.step for p in sqlite_store.metric_series(run.id, "train/reward/mean")]
    assert steps == list(range(1, stopped.step + 1))


def worker_process(run_id: int, database_url: str):
    """The worker of a run (the Ray job's entrypoint, under a shell), by its command line and
    its database: another test session on the machine may run a worker of the same run id."""
    import psutil

    wanted = ["-m", "jobs.worker", str(run_id)]
    for process in psutil.process_iter(["cmdline"]):
        cmdline = process.info["cmdline"] or []
        if any(cmdline[i : i + 3] == wanted for i in range(len(cmdline))):
            try:
                if process.environ().get("ESLAB_DATABASE_URL") == database_url:
                    return process
            except psutil.Error:  # ended, or another user's
                continue
    return None


def test_kill_9_then_resume_finishes_a_real_run(
    scheduler, sqlite_store, sqlite_url, tmp_path, monkeypatch, capsys
):
    from app.cli import main

    run = queue_real_run(sqlite_store, tmp_path, max_steps=4, save_steps=1)
    wait_for(lambda: sqlite_store.checkpoints(run.id), 400, "the first checkpoint", interval=0.2)
    worker = worker_process(run.id, sqlite_url)
    assert worker is not None
    worker.kill()
    failed = wait_for(lambda: ended(sqlite_store, run.id), 30, "the run to be failed")
    assert failed.status is RunStatus.FAILED and failed.step < 4
    steps = [p.step for p in sqlite_store.metric_series(run.id, "train/reward/mean")]
    assert steps == list(range(1, failed.step + 1))

    monkeypatch.setenv("ESLAB_DATABASE_URL", sqlite_url)
    assert main(["resume", str(run.id)]) == 0
    checkpoint = sqlite_store.checkpoints(run.id)[-1]
    assert f"(step {checkpoint.step})" in capsys.readouterr().out
    done = wait_for(lambda: ended(sqlite_store, run.id), 400, "the resumed run", interval=1)
    assert done.status is RunStatus.SUCCEEDED, done.error
    assert done.attempt == 2 and done.ray_submission_id == f"{run.uuid}-2"
    rewards = sqlite_store.metric_series(run.id, "train/reward/mean")
    assert [p.step for p in rewards] == [1, 2, 3, 4]  # none lost, none twice
    assert all(p.value <= 0 for p in rewards)  # conciseness: minus characters off target
    keys = set(sqlite_store.metric_keys(run.id))
    assert {"train/noise_std", "train/learning_rate", "time/generation"} <= keys
    assert [p["member"] for p in sqlite_store.population(run.id, 4)] == [0, 1]
    assert sqlite_store.samples(run.id, split="train", step=1)
    assert sqlite_store.checkpoints(run.id)[-1].step == 4
    assert (tmp_path / "out" / "config.json").is_file()  # the final model
    messages = [e.message for e in sqlite_store.events(run.id)]
    assert f"resumed from {checkpoint.path} at step {checkpoint.step}" in messages
