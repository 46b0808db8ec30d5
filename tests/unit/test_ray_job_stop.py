"""RayJobs.stop's answer around Ray's own (the real job server: tests/jobs/test_ray_jobs.py):
Ray says a job was running while its supervisor actor lives, which outlasts the job's end."""

from __future__ import annotations

import pytest

from jobs.ray_jobs import RayJobs


class SupervisorStillAlive:
    """Ray's client for a job in `status` whose supervisor actor has not exited yet."""

    def __init__(self, status: str) -> None:
        self.status = status
        self.stops: list[str] = []

    def get_job_status(self, submission_id: str) -> str:
        return self.status

    def stop_job(self, submission_id: str) -> bool:
        self.stops.append(submission_id)
        return True


def jobs_with(client: SupervisorStillAlive) -> RayJobs:
    jobs = RayJobs("http://127.0.0.1:1")
    jobs._client = client
    return jobs


@pytest.mark.parametrize("status", ["STOPPED", "SUCCEEDED", "FAILED"])
def test_an_ended_job_is_not_stopped_again(status):
    client = SupervisorStillAlive(status)
    assert jobs_with(client).stop("run-1") is False
    assert client.stops == []


@pytest.mark.parametrize("status", ["PENDING", "RUNNING"])
def test_a_live_job_is_stopped(status):
    client = SupervisorStillAlive(status)
    assert jobs_with(client).stop("run-1") is True
    assert client.stops == ["run-1"]
