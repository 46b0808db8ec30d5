"""The store's queue, cancel, resume, export and lock queries, on SQLite and PostgreSQL."""

import threading
from datetime import UTC, datetime, timedelta

import pytest

from engine.sink import PopulationRecord, SampleRecord, StepReport
from jobs.liveness import silent_seconds
from jobs.store.errors import InvalidTransitionError, StaleAttemptError
from jobs.store.status import RunStatus

CONFIG = {"method": "es", "population_size": 2}


def make_run(store, name="r", **kw):
    return store.create_run(name=name, method="es", config=CONFIG, total_steps=5, **kw)


def report(step):
    return StepReport(
        step=step,
        metrics={"train/reward/mean": float(step), "train/noise_std": 0.01},
        population=[
            PopulationRecord(member=m, seed=m, fitness=step + m, shaped_fitness=m) for m in range(2)
        ],
        samples=[
            SampleRecord(
                split="train",
                prompt_index=0,
                sample_index=0,
                prompt="p",
                completion=f"c{step}",
                reward=float(step),
            )
        ],
        wall_time=100.0 + step,
    )


def test_the_queue_is_oldest_first_and_submitted_runs_become_active(store):
    runs = [make_run(store, name=f"r{i}") for i in range(3)]
    assert [r.name for r in store.queued_runs()] == ["r0", "r1", "r2"]
    assert store.active_runs() == []

    assert store.mark_submitted(runs[0].id, runs[0].uuid)
    assert not store.mark_submitted(runs[0].id, "again")  # already submitted
    assert [r.name for r in store.queued_runs()] == ["r1", "r2"]
    assert [r.ray_submission_id for r in store.active_runs()] == [runs[0].uuid]

    store.clear_submission(runs[0].id)  # Ray did not take it: back in the queue, in order
    assert [r.name for r in store.queued_runs()] == ["r0", "r1", "r2"]


def test_a_worker_cannot_start_a_run_cancelled_before_it_started(store):
    run = make_run(store)
    store.mark_submitted(run.id, run.uuid)
    cancelled = store.request_cancel(run.id)
    assert cancelled.status is RunStatus.CANCELLED and cancelled.finished_at is not None
    assert not store.start_run(run.id)
    assert store.get_run(run.id).status is RunStatus.CANCELLED


def test_a_run_starts_with_its_first_event_in_the_same_write(store):
    """A reader never sees the run running without the phase it starts in (a live Run page
    once showed `running` at step 0 for the moment before `starting engine`)."""
    run = make_run(store)
    assert store.start_run(run.id, event="starting engine")
    assert store.get_run(run.id).status is RunStatus.RUNNING
    assert [e.message for e in store.events(run.id)] == ["starting engine"]
    cancelled = make_run(store)
    store.request_cancel(cancelled.id)
    before = [e.message for e in store.events(cancelled.id)]
    assert not store.start_run(cancelled.id, event="starting engine")
    assert [e.message for e in store.events(cancelled.id)] == before


def test_cancelling_a_running_run_waits_for_its_worker(store):
    run = make_run(store)
    assert store.start_run(run.id)
    assert store.get_run(run.id).started_at is not None
    assert store.request_cancel(run.id).status is RunStatus.CANCELLING
    assert store.request_cancel(run.id).status is RunStatus.CANCELLING  # idempotent
    assert store.beat(run.id) is RunStatus.CANCELLING  # what the worker's heartbeat sees
    assert store.finish_run(run.id, RunStatus.CANCELLED)
    with pytest.raises(InvalidTransitionError, match="already cancelled"):
        store.request_cancel(run.id)
    assert [e.message for e in store.events(run.id)] == ["cancel requested (running -> cancelling)"]


def test_the_first_outcome_recorded_stays(store):
    run = make_run(store)
    store.start_run(run.id)
    assert store.finish_run(run.id, RunStatus.FAILED, error="no heartbeat")
    # The worker was only slow: its late success must not revive the run.
    assert not store.finish_run(run.id, RunStatus.SUCCEEDED)
    after = store.get_run(run.id)
    assert after.status is RunStatus.FAILED and after.error == "no heartbeat"
    with pytest.raises(ValueError, match="terminal"):
        store.finish_run(run.id, RunStatus.RUNNING)


def test_resume_truncates_after_the_checkpoint_and_starts_a_new_attempt(store):
    run = make_run(store)
    store.mark_submitted(run.id, run.uuid)
    store.start_run(run.id)
    for step in (1, 2, 3, 4):
        store.record_step(run.id, report(step))
    store.add_checkpoint(run.id, 2, "/ckpt/checkpoint-2")
    store.add_checkpoint(run.id, 4, "/ckpt/checkpoint-4")
    store.finish_run(run.id, RunStatus.FAILED, error="killed")

    resumed = store.resume_run(run.id, 2)
    assert (resumed.status, resumed.attempt, resumed.step) == (RunStatus.QUEUED, 2, 2)
    assert resumed.error is None and resumed.ray_submission_id is None
    assert resumed.finished_at is None and resumed.uuid == run.uuid
    assert [p.step for p in store.metric_series(run.id, "train/reward/mean")] == [1, 2]
    assert store.latest_metrics([run.id])[run.id]["train/reward/mean"] == 2.0
    assert [c.step for c in store.checkpoints(run.id)] == [2]
    assert store.population(run.id, 3) == []
    assert [r.id for r in store.queued_runs()] == [run.id]
    assert "attempt 2 queued" in store.events(run.id)[-1].message

    # The new attempt rewrites steps 3 and 4: one row per step, never two.
    store.start_run(run.id)
    for step in (3, 4):
        store.record_step(run.id, report(step))
    assert [p.step for p in store.metric_series(run.id, "train/reward/mean")] == [1, 2, 3, 4]
    assert len(store.samples(run.id, split="train", step=3)) == 1


def attempt_writes(store, run_id, attempt, step):
    """Every write a worker makes, as the attempt `attempt`."""
    return {
        "record_step": lambda: store.record_step(run_id, report(step), attempt=attempt),
        "heartbeat": lambda: store.heartbeat(run_id, step, attempt=attempt),
        "beat": lambda: store.beat(run_id, attempt=attempt),
        "add_checkpoint": lambda: store.add_checkpoint(
            run_id, step, f"/ckpt/checkpoint-{step}", attempt=attempt
        ),
        "add_event": lambda: store.add_event(run_id, "info", "late", attempt=attempt),
        "finish_run": lambda: store.finish_run(
            run_id, RunStatus.SUCCEEDED, event="late success", attempt=attempt
        ),
    }


def test_a_resumed_runs_old_attempt_can_write_nothing(store):
    run = make_run(store)
    store.mark_submitted(run.id, run.uuid)
    assert store.start_run(run.id, attempt=1)
    store.record_step(run.id, report(1), attempt=1)
    store.add_checkpoint(run.id, 1, "/ckpt/checkpoint-1", attempt=1)
    assert store.finish_run(run.id, RunStatus.FAILED, error="no heartbeat", attempt=1)
    store.resume_run(run.id, 1)
    # A Ray job of attempt 1 that starts late leaves attempt 2 alone.
    assert not store.start_run(run.id, attempt=1)
    assert store.start_run(run.id, attempt=2)
    before = store.export_run(run.id)

    # Attempt 1's worker was only frozen; it wakes up and writes.
    for name, write in attempt_writes(store, run.id, attempt=1, step=2).items():
        with pytest.raises(
            StaleAttemptError,
            match="attempt 1 may no longer write: the run was resumed as attempt 2",
        ):
            write()
        assert store.export_run(run.id) == before, f"{name} of attempt 1 changed the run"

    writes = attempt_writes(store, run.id, attempt=2, step=2)
    for name in ("record_step", "heartbeat", "add_checkpoint", "add_event"):
        writes[name]()
    assert writes["beat"]() is RunStatus.RUNNING
    assert writes["finish_run"]()
    done = store.get_run(run.id)
    assert (done.status, done.attempt, done.step) == (RunStatus.SUCCEEDED, 2, 2)
    assert [p.step for p in store.metric_series(run.id, "train/reward/mean")] == [1, 2]
    assert [c.step for c in store.checkpoints(run.id)] == [1, 2]
    assert [e.message for e in store.events(run.id)][-2:] == ["late", "late success"]


def test_an_attempt_ended_without_its_worker_can_write_nothing_more(store):
    """The scheduler failed the run for its silent heartbeat while the worker (a foreground
    `eslab train` it cannot stop) was only paused: the worker's writes are refused, and its
    late outcome does not replace the first."""
    run = make_run(store, status=RunStatus.RUNNING)
    store.record_step(run.id, report(1), attempt=1)
    assert store.finish_run(run.id, RunStatus.FAILED, error="no heartbeat", attempt=1)
    before = store.export_run(run.id)
    writes = attempt_writes(store, run.id, attempt=1, step=2)
    for name in ("record_step", "heartbeat", "beat", "add_checkpoint", "add_event"):
        with pytest.raises(
            StaleAttemptError, match="attempt 1 may no longer write: the run is failed"
        ):
            writes[name]()
    assert not writes["finish_run"]()  # the first outcome stands
    assert store.export_run(run.id) == before


def test_only_failed_or_cancelled_runs_resume(store):
    run = make_run(store)
    with pytest.raises(InvalidTransitionError, match="queued; only a failed or cancelled"):
        store.resume_run(run.id, 0)
    store.start_run(run.id)
    store.finish_run(run.id, RunStatus.SUCCEEDED)
    with pytest.raises(InvalidTransitionError, match="eslab clone"):
        store.resume_run(run.id, 0)


def test_export_has_every_row_at_full_resolution(store):
    parent = make_run(store, name="parent")
    run = make_run(store, name="child", parent_id=parent.id)
    for step in range(1, 101):
        store.record_step(run.id, report(step))
    store.add_event(run.id, "info", "hello")
    exported = store.export_run(run.id)
    assert exported.run.parent_id == parent.id
    assert len(exported.metrics) == 200 and len(exported.population) == 200
    assert len(exported.samples) == 100
    first = exported.metrics[0]
    assert first == {"key": "train/noise_std", "step": 1, "value": 0.01, "wall_time": 101.0}
    assert exported.samples[-1]["completion"] == "c100"
    assert exported.population[1] == {
        "step": 1,
        "member": 1,
        "seed": 1,
        "fitness": 2.0,
        "shaped_fitness": 1.0,
        "reward": None,
        "cost": None,
        "sample_rewards": None,
        "sample_costs": None,
    }
    assert [e.message for e in exported.events] == ["hello"]


def test_one_lock_holder_at_a_time_until_its_lease_expires(store):
    assert store.acquire_lock("scheduler", "a", lease_seconds=30)
    assert store.acquire_lock("scheduler", "a", lease_seconds=30)  # renewal
    assert not store.acquire_lock("scheduler", "b", lease_seconds=30)
    holder = store.lock_holder("scheduler")
    assert holder.owner == "a"
    assert timedelta(seconds=25) < holder.expires_at - holder.acquired_at <= timedelta(seconds=31)

    store.release_lock("scheduler", "b")  # not b's: nothing happens
    assert store.lock_holder("scheduler").owner == "a"
    store.release_lock("scheduler", "a")
    assert store.acquire_lock("scheduler", "b", lease_seconds=-1)  # b takes it, lease expired
    assert store.acquire_lock("scheduler", "c", lease_seconds=30)  # so c may take it over
    assert store.lock_holder("scheduler").owner == "c"


def test_racing_lock_takers_get_exactly_one_winner(store):
    results: list[bool] = []
    barrier = threading.Barrier(4)

    def take(owner):
        barrier.wait()
        results.append(store.acquire_lock("race", owner, lease_seconds=30))

    threads = [threading.Thread(target=take, args=(f"o{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [False, False, False, True]


# -- one clock for every host: the database's ------------------------------------------------


@pytest.fixture
def host_clock(monkeypatch):
    """`host_clock(seconds)`: this host's clock is that far off from here on, as the store
    reads it (jobs.store.rows): a worker or scheduler on a machine whose clock drifted."""
    from jobs.store import rows

    def set_skew(seconds: float) -> None:
        class Skewed(datetime):
            @classmethod
            def now(cls, tz=None):
                return datetime.now(tz) + timedelta(seconds=seconds)

        monkeypatch.setattr(rows, "datetime", Skewed)

    return set_skew


def test_a_lease_lasts_by_the_databases_clock_whatever_the_holders_clock(store, host_clock):
    host_clock(-3600)  # the holder's machine runs an hour slow
    assert store.acquire_lock("scheduler", "a", lease_seconds=30)
    host_clock(0)
    assert not store.acquire_lock("scheduler", "b", lease_seconds=30)  # not expired
    host_clock(3600)  # nor for a machine an hour fast
    assert not store.acquire_lock("scheduler", "c", lease_seconds=30)
    assert store.lock_holder("scheduler").owner == "a"


def test_heartbeats_are_written_and_judged_in_the_databases_time(store, host_clock):
    """A worker whose machine runs an hour slow is not an hour silent to the scheduler."""
    run = make_run(store)
    host_clock(-3600)
    assert store.start_run(run.id)
    store.beat(run.id)
    store.heartbeat(run.id, 1)
    store.record_step(run.id, report(1))
    host_clock(0)
    current = store.get_run(run.id)
    for written in (current.heartbeat_at, current.started_at):  # the server is local:
        assert abs(written - datetime.now(UTC)) < timedelta(seconds=60)  # its clock is ours
    database_now = store.database_now()
    assert abs(database_now - datetime.now(UTC)) < timedelta(seconds=60)
    assert silent_seconds(current, database_now) < 60
