"""When a live run's worker counts as gone: its last sign of life (the heartbeat, else the
start) is older than the heartbeat timeout (ESLAB_HEARTBEAT_TIMEOUT_S, the scheduler's
setting). One rule for the scheduler, which ends such a run, and for the dashboard and
`eslab runs`, which mark it stale while no scheduler runs to end it."""

from __future__ import annotations

from datetime import UTC, datetime

from jobs.store.records import RunRecord
from jobs.store.status import LIVE


def silent_seconds(run: RunRecord, now: datetime | None = None) -> float | None:
    """Seconds since the run's worker last showed life; None unless the run is live."""
    last = run.heartbeat_at or run.started_at
    if run.status not in LIVE or last is None:
        return None
    return ((now or datetime.now(UTC)) - last).total_seconds()


def is_silent(run: RunRecord, timeout: float, now: datetime | None = None) -> bool:
    silent = silent_seconds(run, now)
    return silent is not None and silent > timeout


def status_label(run: RunRecord, timeout: float, now: datetime | None = None) -> str:
    """The run's status, with how long it has been silent when that is past the timeout:
    without `eslab serve`, nothing ends a run whose worker was killed."""
    silent = silent_seconds(run, now)
    if silent is None or silent <= timeout:
        return run.status.value
    return f"{run.status.value} (stale: no heartbeat for {_minutes(silent)})"


def _minutes(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.0f} h"
