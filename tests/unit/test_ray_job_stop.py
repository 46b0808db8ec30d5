"""RayJobs' answers around two races of Ray's own job supervisor (the real job server:
tests/jobs/test_ray_jobs.py, and the cancels of tests/jobs/test_scheduler.py, which meet the
second race now and then): Ray says a job was running while its supervisor actor lives,
which outlasts the job's end; and a stop_job that lands as the job's process exits by itself
leaves the job FAILED (the supervisor's lookup of the gone process raises). The job infos
below are what Ray 2.60 returned for each case, reproduced by stopping jobs at the moment
they exit."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from jobs.ray_jobs import JobState, RayJobs

STOP_CROSSED_EXIT = SimpleNamespace(
    error_type="JOB_ENTRYPOINT_COMMAND_START_ERROR",
    driver_exit_code=None,
    message=(
        "Traceback (most recent call last):\n"
        '  File ".../ray/dashboard/modules/job/job_supervisor.py", line 402, in run\n'
        "    job_process = psutil.Process(child_pid)\n"
        "    raise NoSuchProcess(pid, msg=msg) from None\n"
        "psutil.NoSuchProcess: process PID not found (pid=8579)\n"
    ),
)
EXITED_WITH_AN_ERROR = SimpleNamespace(
    error_type="JOB_ENTRYPOINT_COMMAND_ERROR",
    driver_exit_code=1,
    message="Job entrypoint command failed with exit code 1, last available logs ...",
)
COULD_NOT_START = SimpleNamespace(
    error_type="JOB_ENTRYPOINT_COMMAND_START_ERROR",
    driver_exit_code=None,
    message="Traceback (most recent call last):\nFileNotFoundError: [Errno 2] No such file",
)


class SupervisorStillAlive:
    """Ray's client for a job in `status` whose supervisor actor has not exited yet."""

    def __init__(self, status: str, info: SimpleNamespace = EXITED_WITH_AN_ERROR) -> None:
        self.status = status
        self.info = info
        self.stops: list[str] = []

    def get_job_status(self, submission_id: str) -> str:
        return self.status

    def get_job_info(self, submission_id: str) -> SimpleNamespace:
        return self.info

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


def test_a_stop_that_crossed_the_jobs_own_exit_reads_stopped():
    assert jobs_with(SupervisorStillAlive("FAILED", STOP_CROSSED_EXIT)).state("run-1") is (
        JobState.STOPPED
    )


@pytest.mark.parametrize("info", [EXITED_WITH_AN_ERROR, COULD_NOT_START])
def test_a_job_that_failed_otherwise_stays_failed(info):
    assert jobs_with(SupervisorStillAlive("FAILED", info)).state("run-1") is JobState.FAILED
