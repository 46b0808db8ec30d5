"""What a Ray job's worker is told: the reward allow-list, data folder and input and output
roots it checks runs against are those the scheduler's process validated them with, and how
many runs share the cores."""

from __future__ import annotations

import pytest

from engine.backends.vllm.cpu import resources
from engine.paths import INPUT_ROOTS_SETTING, OUTPUT_ROOTS_SETTING, PROJECT_ROOT
from engine.rewards import REWARD_MODULES_SETTING
from jobs.scheduler import Scheduler, SchedulerSettings


@pytest.mark.parametrize("value", ["mylab.rewards,/srv/eslab/rewards", None])
def test_job_env_hands_the_reward_allow_list_to_the_worker(sqlite_store, monkeypatch, value):
    if value is None:
        monkeypatch.delenv(REWARD_MODULES_SETTING, raising=False)
    else:
        monkeypatch.setenv(REWARD_MODULES_SETTING, value)
    # job_env reads the store's URL and the settings only; no Ray job is submitted here.
    env = Scheduler(sqlite_store, ray_jobs=None).job_env()
    # Unset here means empty there: never a wider list inherited from the Ray head.
    assert env[REWARD_MODULES_SETTING] == (value or "")


@pytest.mark.parametrize(("runs", "threads"), [(1, "2"), (2, "1")])
def test_a_cpu_engine_of_a_job_takes_its_share_of_the_cores(sqlite_store, runs, threads):
    settings = SchedulerSettings(max_concurrent_runs=runs)
    env = Scheduler(sqlite_store, ray_jobs=None, settings=settings).job_env()
    assert env["ESLAB_CPU_RUNS_SHARING"] == str(runs)
    # what the engine in that job then runs with, on two cores
    assert resources.thread_env([0, 1], environ=env) == {"OMP_NUM_THREADS": threads}


def test_job_env_hands_the_folders_this_process_resolved_to_the_worker(
    sqlite_store, monkeypatch, tmp_path
):
    """The worker validates a run's paths again: against this process's data folder and
    roots, resolved here and always set, never those the Ray head was started with."""
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    monkeypatch.setenv("ESLAB_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv(OUTPUT_ROOTS_SETTING, f"{tmp_path / 'link'}:data/scratch")
    monkeypatch.delenv(INPUT_ROOTS_SETTING, raising=False)
    env = Scheduler(sqlite_store, ray_jobs=None).job_env()
    assert env["ESLAB_DATA_DIR"] == str(tmp_path / "data")
    assert env[OUTPUT_ROOTS_SETTING] == f"{tmp_path / 'real'}:{tmp_path / 'data' / 'scratch'}"
    assert env[INPUT_ROOTS_SETTING] == ""  # unset here means empty there
    monkeypatch.delenv("ESLAB_DATA_DIR")
    monkeypatch.delenv(OUTPUT_ROOTS_SETTING)
    env = Scheduler(sqlite_store, ray_jobs=None).job_env()
    assert env["ESLAB_DATA_DIR"] == str(PROJECT_ROOT / "data")
    assert env[OUTPUT_ROOTS_SETTING] == ""
