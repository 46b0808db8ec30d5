"""The Ray jobs wrapper against a real local Ray head."""

from __future__ import annotations

import sys
import uuid

import pytest

from jobs.ray_jobs import JobState, RayJobs, RayUnavailableError
from tests.jobs.conftest import free_port
from tests.jobs.helpers import wait_for

pytestmark = pytest.mark.heavy


def python(code: str) -> str:
    return f"{sys.executable} -c {code!r}"


def test_submit_is_idempotent_and_state_logs_and_env_come_back(ray_address):
    jobs = RayJobs(ray_address)
    sid = f"test-{uuid.uuid4()}"
    # Ray's job supervisor writes its own "Running entrypoint" line to the log as the child
    # starts; under load the child's line came first. The pause makes "hello 42" the last.
    entry = python("import os, time; time.sleep(1); print('hello', os.environ['ESLAB_X'])")
    assert jobs.submit(sid, entry, env_vars={"ESLAB_X": "42"})
    assert not jobs.submit(sid, python("print('second copy')"))  # refused: same id
    state = wait_for(lambda: (s := jobs.state(sid)).is_terminal() and s, 60, "the job to end")
    assert state is JobState.SUCCEEDED
    assert "hello 42" in jobs.log_tail(sid)
    assert "second copy" not in jobs.log_tail(sid)
    assert jobs.log_tail(sid, max_chars=12) == "...\nhello 42\n"  # whole lines only


def test_stop_ends_a_running_job_and_unknown_jobs_are_missing(ray_address):
    jobs = RayJobs(ray_address)
    sid = f"test-{uuid.uuid4()}"
    jobs.submit(sid, python("import time; print('up', flush=True); time.sleep(300)"))
    wait_for(lambda: "up" in jobs.log_tail(sid), 60, "the job to start")
    assert jobs.stop(sid)
    wait_for(lambda: jobs.state(sid) is JobState.STOPPED, 30, "the job to stop")
    assert not jobs.stop(sid)  # already ended
    assert jobs.state("no-such-job") is JobState.MISSING
    assert JobState.MISSING.is_terminal() and not JobState.PENDING.is_terminal()


def test_cluster_resources_are_the_heads(ray_address):
    assert RayJobs(ray_address).cluster_resources()["CPU"] == 2.0


def test_an_unreachable_job_server_is_one_clear_error():
    jobs = RayJobs(f"http://127.0.0.1:{free_port()}")
    with pytest.raises(RayUnavailableError, match="cannot reach Ray's job server"):
        jobs.state("anything")
