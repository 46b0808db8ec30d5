"""Run and sweep status, and the one transition rule of runs that every writer goes
through."""

from __future__ import annotations

from enum import StrEnum


class RunStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"

    def is_terminal(self) -> bool:
        return self in TERMINAL


TERMINAL = frozenset({RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED})
LIVE = frozenset({RunStatus.RUNNING, RunStatus.CANCELLING})
"""The statuses in which a worker trains: it heartbeats and writes steps, checkpoints, events."""

# A resumed run goes from a terminal failed/cancelled state back to queued; nothing else may
# leave a terminal state, so a late write from a dying worker cannot revive a finished run.
_ALLOWED: dict[RunStatus, frozenset[RunStatus]] = {
    RunStatus.QUEUED: frozenset({RunStatus.RUNNING, RunStatus.CANCELLED, RunStatus.FAILED}),
    RunStatus.RUNNING: frozenset(
        {RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLING, RunStatus.CANCELLED}
    ),
    RunStatus.CANCELLING: frozenset({RunStatus.CANCELLED, RunStatus.FAILED}),
    RunStatus.SUCCEEDED: frozenset(),
    RunStatus.FAILED: frozenset({RunStatus.QUEUED}),
    RunStatus.CANCELLED: frozenset({RunStatus.QUEUED}),
}


def can_transition(current: RunStatus, new: RunStatus) -> bool:
    return new in _ALLOWED[current]


class SweepStatus(StrEnum):
    """A sweep is active until nothing more is to be asked of it (finished) or a person
    cancels it; only active sweeps queue runs. A finished sweep whose run was resumed is
    active again until that run ends (jobs.sweeps.driver)."""

    ACTIVE = "active"
    FINISHED = "finished"
    CANCELLED = "cancelled"
