"""A thin wrapper of Ray's JobSubmissionClient: submit, state, stop, log tail, capacity.

Why a wrapper: the scheduler needs four answers from Ray and must tell "Ray is unreachable"
(skip this tick, change nothing) from "the job is gone" (the run died). The client reports
both as bare RuntimeError/ConnectionError; here they become `RayUnavailableError` and
`JobState.MISSING`. Submissions use a caller-chosen `submission_id`, which Ray refuses to
reuse, so a repeated submit can never start a second copy of a run
(Ray's job_submission SDK).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any


class RayUnavailableError(Exception):
    """Ray's job server cannot be reached (cluster down, wrong RAY_ADDRESS)."""


class SubmitError(Exception):
    """Ray refused a submission for a reason other than a duplicate id."""


class JobState(StrEnum):
    """Ray's job status, plus MISSING for a job Ray does not know (a restarted cluster)."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    STOPPED = "STOPPED"
    MISSING = "MISSING"

    def is_terminal(self) -> bool:
        """True when no process of the job runs any more (MISSING included)."""
        return self not in (JobState.PENDING, JobState.RUNNING)

    @property
    def message(self) -> str:
        return _MESSAGES[self]


_MESSAGES = {
    JobState.PENDING: "is waiting for Ray to start it",
    JobState.RUNNING: "is running",
    JobState.SUCCEEDED: "exited normally",
    JobState.FAILED: "failed (its process exited with an error or was killed)",
    JobState.STOPPED: "was stopped",
    JobState.MISSING: "is unknown to Ray (was the Ray cluster restarted?)",
}


ENTRYPOINT_START_ERROR = "JOB_ENTRYPOINT_COMMAND_START_ERROR"
"""The error type Ray's job supervisor gives any exception of its own while it runs a job."""
SUPERVISOR_LOOKUP_FAILED = "psutil.NoSuchProcess"
"""How that exception reads when a stop_job crossed the entrypoint's own exit."""


class RayJobs:
    """Ray jobs at one address: the dashboard URL of the local head or RAY_ADDRESS."""

    def __init__(self, address: str | None = None) -> None:
        self.address = address
        self._client: Any = None

    @property
    def client(self) -> Any:
        # Created on first use: the constructor already talks to the cluster.
        if self._client is None:
            from ray.job_submission import JobSubmissionClient

            _use_local_auth_token()
            try:
                self._client = JobSubmissionClient(self.address)
            except (ConnectionError, RuntimeError, ValueError) as exc:
                raise RayUnavailableError(
                    f"cannot reach Ray's job server at {self.address or 'the local cluster'}: "
                    f"{exc}; start it with `eslab serve` or check RAY_ADDRESS"
                ) from exc
        return self._client

    def submit(
        self,
        submission_id: str,
        entrypoint: str,
        *,
        env_vars: dict[str, str] | None = None,
        metadata: dict[str, str] | None = None,
        num_gpus: float = 0,
    ) -> bool:
        """Start `entrypoint` as job `submission_id`; False when that job already exists
        (the submission happened before, e.g. by a scheduler that died right after).

        num_gpus > 0 reserves that many GPUs for the job's own process, and Ray sets its
        CUDA_VISIBLE_DEVICES to them: two jobs on a machine of two GPUs then compute on one
        card each instead of both on the first."""
        try:
            self.client.submit_job(
                entrypoint=entrypoint,
                submission_id=submission_id,
                runtime_env={"env_vars": dict(env_vars or {})},
                metadata=dict(metadata or {}),
                **({"entrypoint_num_gpus": num_gpus} if num_gpus > 0 else {}),
            )
            return True
        except ConnectionError as exc:
            raise RayUnavailableError(f"Ray's job server went away: {exc}") from exc
        except RuntimeError as exc:
            # A duplicate id comes back as an HTTP 500 whose text is a traceback; asking
            # for the job is the robust test.
            if self.state(submission_id) is not JobState.MISSING:
                return False
            if "status code 5" in str(exc):  # e.g. "No available agent": a head still starting
                raise RayUnavailableError(
                    f"Ray could not take job {submission_id} now: {_last_line(exc)}"
                ) from exc
            raise SubmitError(f"Ray refused job {submission_id}: {_last_line(exc)}") from exc

    def state(self, submission_id: str) -> JobState:
        try:
            state = JobState(str(self.client.get_job_status(submission_id)))
            if state is JobState.FAILED and self._stopped_as_it_exited(submission_id):
                return JobState.STOPPED
            return state
        except ConnectionError as exc:
            raise RayUnavailableError(f"Ray's job server went away: {exc}") from exc
        except RuntimeError as exc:
            if "404" in str(exc) or "does not exist" in str(exc):
                return JobState.MISSING
            raise RayUnavailableError(f"Ray's job server failed: {_last_line(exc)}") from exc

    def _stopped_as_it_exited(self, submission_id: str) -> bool:
        """Whether a FAILED job is one whose stop crossed its own exit. Ray's job supervisor
        (job_supervisor.py, Ray 2.60), once a stop_job arrives, looks the entrypoint's
        process up to signal it; when the process has just exited by itself (a worker that
        saw the cancel in the database and ended the run cancelled, as the scheduler asked
        Ray to stop it), that lookup raises psutil.NoSuchProcess and the supervisor records
        the job FAILED, with no exit code. The stop was asked and nothing failed: STOPPED."""
        info = self.client.get_job_info(submission_id)
        return (
            info.driver_exit_code is None
            and getattr(info.error_type, "value", info.error_type) == ENTRYPOINT_START_ERROR
            and SUPERVISOR_LOOKUP_FAILED in (info.message or "")
        )

    def stop(self, submission_id: str) -> bool:
        """Ask Ray to stop the job: SIGTERM to its processes, then SIGKILL after the job's
        RAY_JOB_STOP_WAIT_TIME_S. False when the job had already ended or is unknown.

        The job's state is asked first: Ray answers True while the job's supervisor actor is
        alive, and that actor outlives the job's terminal state by a moment (seen under
        load: a job STOPPED, then "stopped" again)."""
        if self.state(submission_id).is_terminal():
            return False
        try:
            return bool(self.client.stop_job(submission_id))
        except ConnectionError as exc:
            raise RayUnavailableError(f"Ray's job server went away: {exc}") from exc
        except RuntimeError:
            return False

    def exit_code(self, submission_id: str) -> int | None:
        """The exit code of the job's entrypoint (negative: the signal that killed it), None
        while it runs or when Ray cannot say."""
        try:
            code = self.client.get_job_info(submission_id).driver_exit_code
        except (ConnectionError, RuntimeError):
            return None
        return None if code is None else int(code)

    def log_tail(self, submission_id: str, max_chars: int = 4000) -> str:
        """The end of the job's output (stdout and stderr), where a traceback would be."""
        try:
            text = self.client.get_job_logs(submission_id)
        except (ConnectionError, RuntimeError) as exc:
            return f"(the job's log could not be read: {_last_line(exc)})"
        if len(text) <= max_chars:
            return text
        cut = text[-max_chars:]
        newline = cut.find("\n")
        if 0 <= newline < len(cut) - 1:  # drop the partial first line
            cut = cut[newline + 1 :]
        return "...\n" + cut

    def cluster_resources(self) -> dict[str, float]:
        """Total resources of the live nodes (CPU, GPU, ...), from Ray's state API at the
        same address as the job server."""
        from ray.util.state import list_nodes

        _use_local_auth_token()
        try:
            nodes = list_nodes(address=self.address, detail=True, raise_on_missing_output=False)
        except Exception as exc:  # the state API raises several kinds when unreachable
            raise RayUnavailableError(f"cannot list Ray's nodes: {_last_line(exc)}") from exc
        total: dict[str, float] = {}
        for node in nodes:
            if node.state != "ALIVE":
                continue
            for name, amount in (node.resources_total or {}).items():
                total[name] = total.get(name, 0.0) + float(amount)
        return total


def _use_local_auth_token() -> None:
    """Ray 2.5x+ clusters started by ray.init require a token (kept in ~/.ray/auth_token).
    A Ray driver switches token auth on when it connects; this process is not a driver,
    so do the same for its HTTP clients (RAY_AUTH_MODE, when set, still decides)."""
    try:
        from ray._private.authentication.authentication_token_setup import (
            maybe_enable_token_auth_if_token_available,
        )
    except ImportError:  # an older Ray without token auth
        return
    maybe_enable_token_auth_if_token_available(warn_if_disabled=False)


def _last_line(exc: BaseException) -> str:
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else type(exc).__name__
