"""What a Ray job's worker is told: the reward allow-list it checks runs against is the one
the scheduler's process validated them with, and how many runs share the cores."""

from __future__ import annotations

import pytest

from engine.backends.vllm.cpu import resources
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
