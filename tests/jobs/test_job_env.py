"""What a Ray job's worker is told: the reward allow-list it checks runs against is the one
the scheduler's process validated them with."""

from __future__ import annotations

import pytest

from engine.rewards import REWARD_MODULES_SETTING
from jobs.scheduler import Scheduler


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
