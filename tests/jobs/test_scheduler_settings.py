"""The scheduler's ESLAB_* settings: a value that is not a number above 0 is refused with
its name (a heartbeat timeout of 0 or less would fail every healthy run)."""

from __future__ import annotations

import pytest

from jobs.scheduler import SchedulerSettings


@pytest.mark.parametrize("value", ["abc", "0", "-5", "nan", "inf"])
def test_a_bad_number_is_refused_with_its_name(value):
    with pytest.raises(
        ValueError,
        match=f"ESLAB_HEARTBEAT_TIMEOUT_S must be a finite number above 0, got '{value}'",
    ):
        SchedulerSettings.from_env({"ESLAB_HEARTBEAT_TIMEOUT_S": value})


def test_numbers_above_0_are_taken():
    settings = SchedulerSettings.from_env(
        {"ESLAB_HEARTBEAT_TIMEOUT_S": "2.5", "ESLAB_MAX_CONCURRENT_RUNS": "3"}
    )
    assert (settings.heartbeat_timeout_seconds, settings.max_concurrent_runs) == (2.5, 3)
