"""The sweep driver (jobs/sweeps/driver.py) with the real store on a temporary SQLite file:
runs are queued through jobs.launch, and a test plays the worker by writing what it writes
(start, metrics through record_step, the outcome). No Ray: the driver only reads and
writes the database; tests/app/test_e2e_sweep.py runs a sweep through `eslab serve`."""

from __future__ import annotations

import threading

import pytest

from engine.config import ConfigError, RunConfig
from engine.data.datasets import Example, write_dataset
from engine.sink import StepReport
from jobs.scheduler import Scheduler, SchedulerSettings
from jobs.store.errors import InvalidTransitionError, StoreError
from jobs.store.status import RunStatus, SweepStatus
from jobs.store.store import Store
from jobs.sweeps.driver import (
    advance_sweeps,
    cancel_sweep,
    queue_trial,
    start_sweep,
    sweep_table,
    sweep_trials,
)
from jobs.sweeps.history import PRUNED
from jobs.sweeps.spec import parse_space
from tests.jobs.helpers import SubmittingRay
from tests.model_folders import DEFAULT_MODEL, placeholder_model

REWARD = "train/reward/mean"


@pytest.fixture
def data(monkeypatch, tmp_path):
    """A data folder of its own with the default model's folder (queueing checks it; no run
    here loads it) and two small datasets."""
    folder = tmp_path / "data"
    monkeypatch.setenv("ESLAB_DATA_DIR", str(folder))
    placeholder_model(folder / "models" / DEFAULT_MODEL)
    for name in ("a", "b"):
        write_dataset(
            [
                Example(
                    prompt=[{"role": "user", "content": f"say {i}"}],
                    reward_func_args={"target": "ok"},
                )
                for i in range(8)
            ],
            folder / "tasks" / f"{name}.parquet",
        )
    return folder


@pytest.fixture
def base(data, tmp_path) -> RunConfig:
    return RunConfig.from_flat(
        {
            "method": "es",
            "train_file": "data/tasks/a.parquet",
            "output_dir": str(tmp_path / "out"),
            "reward_func_path": "engine.rewards.conciseness.compute_score",
            "data_batch_size": 4,
            "max_steps": 2,
            "population_size": 4,
        }
    )


def sweep_of(store, base, name="sw", tags=(), **space):
    mapping = {
        "parameters": {"noise_std": {"values": [0.001, 0.002, 0.003]}},
        "objective": {"metric": REWARD, "mode": "max"},
        **space,
    }
    return start_sweep(store, base, parse_space(mapping, base), name=name, tags=tags)


def play(store, run, values, status=RunStatus.SUCCEEDED):
    """What a worker writes: the start, one step of metrics per value, the outcome."""
    if store.get_run(run.id).status is RunStatus.QUEUED:
        assert store.start_run(run.id)
    for step, value in enumerate(values, start=1):
        store.record_step(run.id, StepReport(step=step, metrics={REWARD: value}))
    if status is not RunStatus.RUNNING:
        assert store.finish_run(run.id, status)


def runs_of(store, sweep):
    return store.sweep_runs(sweep.id)


def test_a_grid_sweep_queues_its_runs_within_parallel_and_finishes(sqlite_store, base, tmp_path):
    store = sqlite_store
    sweep = sweep_of(store, base, parallel=2)
    assert runs_of(store, sweep) == []  # the scheduler queues them, not the start
    advance_sweeps(store)
    first, second = runs_of(store, sweep)
    assert [(r.name, r.sweep_trial, r.status) for r in (first, second)] == [
        ("sw-t000", 0, RunStatus.QUEUED),
        ("sw-t001", 1, RunStatus.QUEUED),
    ]
    assert first.tags == ["sweep:sw"] and first.total_steps == 2
    assert [r.config["noise_std"] for r in (first, second)] == [0.001, 0.002]
    assert first.config["run_name"] == "sw-t000"
    assert first.config["output_dir"] == str(tmp_path / "out" / "sw-t000")  # one folder each
    assert first.config["population_size"] == 4  # the rest is the base's

    advance_sweeps(store)  # nothing changed: nothing more is queued
    assert len(runs_of(store, sweep)) == 2

    play(store, first, [1.0, 2.0])
    advance_sweeps(store)
    third = runs_of(store, sweep)[2]
    assert (third.name, third.config["noise_std"]) == ("sw-t002", 0.003)
    play(store, second, [3.0])
    advance_sweeps(store)  # the grid is spent, but a run is live
    assert store.get_sweep(sweep.id).status is SweepStatus.ACTIVE
    play(store, third, [0.5], RunStatus.FAILED)
    advance_sweeps(store)
    assert store.get_sweep(sweep.id).status is SweepStatus.FINISHED
    assert len(runs_of(store, sweep)) == 3

    table = sweep_table(store, sweep.id)
    assert list(table.columns) == [
        "trial", "run_id", "run", "status", "state", "step", "noise_std", "objective", "rank"
    ]  # fmt: skip
    assert table["state"].tolist() == ["complete", "complete", "failed"]
    assert table["objective"].tolist() == [2.0, 3.0, 0.5]  # the last value of each
    assert table["rank"].tolist()[:2] == [2, 1] and table["rank"].isna().tolist()[2]


def test_the_budget_counts_every_run_and_random_draws_from_the_range(sqlite_store, base):
    store = sqlite_store
    space = {
        "method": "random",
        "budget": 3,
        "parallel": 3,
        "parameters": {"noise_std": {"low": 0.0005, "high": 0.005, "log": True}},
    }
    sweep = sweep_of(store, base, **space)
    advance_sweeps(store)
    runs = runs_of(store, sweep)
    assert len(runs) == 3
    assert all(0.0005 <= r.config["noise_std"] <= 0.005 for r in runs)
    assert len({r.config["noise_std"] for r in runs}) == 3
    for run in runs:
        play(store, run, [1.0], RunStatus.FAILED)
    advance_sweeps(store)  # failed runs are trials: the budget is spent
    assert len(runs_of(store, sweep)) == 3
    assert store.get_sweep(sweep.id).status is SweepStatus.FINISHED


def test_a_running_run_behind_the_others_is_stopped_early_and_counts_as_pruned(sqlite_store, base):
    store = sqlite_store
    space = {
        "method": "random",
        "budget": 4,
        "parallel": 3,
        "parameters": {"noise_std": {"low": 0.0005, "high": 0.005}},
        "early_stopping": {"rule": "median", "min_step": 2, "min_runs": 2},
    }
    sweep = sweep_of(store, base, **space)
    advance_sweeps(store)
    good, better, poor = runs_of(store, sweep)
    play(store, good, [1.0, 2.0, 3.0])
    play(store, better, [2.0, 3.0, 4.0])
    play(store, poor, [0.5], RunStatus.RUNNING)
    advance_sweeps(store)  # step 1 < min_step: no decision yet
    assert store.get_run(poor.id).status is RunStatus.RUNNING
    play(store, poor, [0.5, 0.6], RunStatus.RUNNING)
    advance_sweeps(store)
    stopped = store.get_run(poor.id)
    assert stopped.status is RunStatus.CANCELLING  # cancelled as `eslab cancel` does
    reason = next(e for e in store.events(poor.id) if e.message.startswith(PRUNED))
    assert reason.message.startswith(f"{PRUNED} (attempt 1): {REWARD}: the best 0.6 by step 2")
    assert "median 2 of 2 other runs" in reason.message
    store.finish_run(poor.id, RunStatus.CANCELLED)  # its worker stops
    states = {t.run.id: t.trial.state for t in sweep_trials(store, sweep.id)}
    assert states[poor.id] == "pruned"
    assert len(runs_of(store, sweep)) == 4  # the stopped run's place went to the next trial

    # a run a person cancels is a failed trial, not a pruned one
    fourth = runs_of(store, sweep)[3]
    store.request_cancel(fourth.id)
    assert {t.run.id: t.trial.state for t in sweep_trials(store, sweep.id)}[fourth.id] == "failed"


def test_a_trial_that_cannot_be_queued_is_a_failed_run_and_the_sweep_goes_on(
    sqlite_store, base, data
):
    store = sqlite_store
    space = {"parameters": {"train_file": {"values": ["data/tasks/a.parquet", "data/x.parquet"]}}}
    sweep = sweep_of(store, base, parallel=1, **space)
    advance_sweeps(store)
    (first,) = runs_of(store, sweep)
    assert first.status is RunStatus.QUEUED
    assert first.config["train_file"] == str(data / "tasks" / "a.parquet")  # stored resolved
    play(store, first, [1.0])
    advance_sweeps(store)
    second = runs_of(store, sweep)[1]  # the next grid point, not the first one again
    assert second.status is RunStatus.FAILED and second.name == "sw-t001"
    assert "the sweep could not queue this trial" in second.error and "x.parquet" in second.error
    assert [t.trial.params["train_file"] for t in sweep_trials(store, sweep.id)] == [
        "data/tasks/a.parquet",
        "data/x.parquet",
    ]  # as the space gives them
    assert store.get_sweep(sweep.id).status is SweepStatus.FINISHED


def test_every_run_of_a_sweep_carries_its_tags_a_failed_trial_too(sqlite_store, base):
    store = sqlite_store
    space = {"parameters": {"train_file": {"values": ["data/tasks/a.parquet", "data/x.parquet"]}}}
    sweep = sweep_of(store, base, tags=["night", "sweep:sw", "lr", "night"], parallel=2, **space)
    assert store.get_sweep(sweep.id).tags == ["night", "sweep:sw", "lr"]  # each once, in order
    advance_sweeps(store)
    queued, failed = runs_of(store, sweep)
    assert (queued.status, failed.status) == (RunStatus.QUEUED, RunStatus.FAILED)
    for run in (queued, failed):
        assert run.tags == ["sweep:sw", "night", "lr"]
    runs, total = store.search_runs(tag="night")
    assert total == 2 and {r.id for r in runs} == {queued.id, failed.id}


def test_cancelling_a_sweep_cancels_its_queued_and_running_runs(sqlite_store, base):
    store = sqlite_store
    sweep = sweep_of(store, base, parallel=2)
    advance_sweeps(store)
    running, queued = runs_of(store, sweep)
    play(store, running, [1.0], RunStatus.RUNNING)
    cancelled = cancel_sweep(store, "sw")
    assert [(r.id, r.status) for r in cancelled] == [
        (running.id, RunStatus.CANCELLING),
        (queued.id, RunStatus.CANCELLED),
    ]
    assert "its sweep was cancelled" in [e.message for e in store.events(queued.id)]
    assert store.get_sweep(sweep.id).status is SweepStatus.CANCELLED
    advance_sweeps(store)
    assert len(runs_of(store, sweep)) == 2  # a cancelled sweep queues nothing more
    with pytest.raises(InvalidTransitionError, match="already cancelled"):
        cancel_sweep(store, sweep.id)
    # a trial that a pass had begun before the cancel is refused, and nothing is stored
    assert queue_trial(store, store.get_sweep(sweep.id), 2, {"noise_std": 0.003}) is None
    assert len(runs_of(store, sweep)) == 2


def test_a_resumed_run_of_a_finished_sweep_is_watched_again(sqlite_store, base):
    store = sqlite_store
    sweep = sweep_of(store, base, parallel=3)
    advance_sweeps(store)
    runs = runs_of(store, sweep)
    for run in runs:
        play(store, run, [1.0], RunStatus.FAILED)
    advance_sweeps(store)
    assert store.get_sweep(sweep.id).status is SweepStatus.FINISHED
    store.resume_run(runs[0].id, 0)
    advance_sweeps(store)
    assert store.get_sweep(sweep.id).status is SweepStatus.ACTIVE
    assert len(runs_of(store, sweep)) == 3  # the budget stays spent
    play(store, store.get_run(runs[0].id), [5.0])
    advance_sweeps(store)
    assert store.get_sweep(sweep.id).status is SweepStatus.FINISHED
    assert sweep_table(store, sweep.id)["rank"].tolist()[0] == 1


def test_two_passes_at_once_never_queue_a_trial_twice(sqlite_store, sqlite_url, base):
    """The scheduler's lock lets one scheduler tick at a time; should two passes race all
    the same (a lock that expired under a slow tick), the database takes each trial once."""
    sweep = sweep_of(sqlite_store, base, parallel=3)
    stores = [Store(sqlite_url) for _ in range(2)]
    barrier = threading.Barrier(2)

    def advance(store):
        barrier.wait()
        advance_sweeps(store)

    threads = [threading.Thread(target=advance, args=(s,)) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for s in stores:
        s.close()
    runs = runs_of(sqlite_store, sweep)
    assert sorted(r.sweep_trial for r in runs) == [0, 1, 2]
    assert sorted(r.config["noise_std"] for r in runs) == [0.001, 0.002, 0.003]


def test_a_sweep_is_refused_before_anything_is_stored(sqlite_store, base, tmp_path):
    store = sqlite_store
    missing = base.with_overrides([f"train_file={tmp_path / 'nope.parquet'}"])
    with pytest.raises(Exception, match=r"nope\.parquet"):
        sweep_of(store, missing)
    with pytest.raises(ConfigError, match="the sweep name 'a/b' names its runs like"):
        sweep_of(store, base, name="a/b")
    assert store.list_sweeps() == []
    sweep_of(store, base)
    with pytest.raises(StoreError, match="a sweep named 'sw' exists already"):
        sweep_of(store, base)


def test_the_scheduler_queues_a_sweeps_runs_within_its_own_limits(sqlite_store, base):
    store = sqlite_store
    sweep_of(store, base, parallel=2)
    ray = SubmittingRay()
    Scheduler(store, ray, SchedulerSettings(max_concurrent_runs=1)).tick()
    assert ray.submitted == ["sw-t000"]  # two queued, one started: max_concurrent_runs
    assert [r.name for r in store.queued_runs()] == ["sw-t001"]
