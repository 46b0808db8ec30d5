"""When a live run's worker counts as gone: its last sign of life (the heartbeat, else the
start) is older than the heartbeat timeout (ESLAB_HEARTBEAT_TIMEOUT_S, the scheduler's
setting). One rule for the scheduler, which ends such a run, and for the dashboard and
`eslab runs`, which mark it stale while no scheduler runs to end it. Heartbeats are written
in the database's time, so each caller passes `now` from Store.database_now(), never this
host's clock: a host whose clock is off would otherwise call a beating run stale, or a dead
one alive."""

from __future__ import annotations

from datetime import datetime
from typing import Protocol

from jobs.store.records import RunRecord
from jobs.store.status import LIVE, RunStatus


class Beating(Protocol):
    """A run as far as its liveness goes: a RunRecord, or a RunSign (what live pages poll)."""

    @property
    def status(self) -> RunStatus: ...
    @property
    def started_at(self) -> datetime | None: ...
    @property
    def heartbeat_at(self) -> datetime | None: ...


def _last_sign(run: Beating) -> datetime | None:
    """The live run's worker's last sign of life; None unless the run is live."""
    return (run.heartbeat_at or run.started_at) if run.status in LIVE else None


def silent_seconds(run: Beating, now: datetime) -> float | None:
    """Seconds from the run's worker's last sign of life to `now` (the database's time);
    None unless the run is live."""
    last = _last_sign(run)
    return None if last is None else (now - last).total_seconds()


def silent_since(run: Beating, timeout: float, now: datetime) -> datetime | None:
    """The live run's worker's last sign of life, once it is older than the timeout; None
    otherwise. A page that is not redrawn as time passes can say since when, which stays
    true, where "for how long" would not."""
    last = _last_sign(run)
    return last if last is not None and (now - last).total_seconds() > timeout else None


def stale_for(run: RunRecord, timeout: float, now: datetime) -> str | None:
    """How long the live run's worker has been silent, in words, once that is past the
    timeout; None otherwise. Without `eslab serve`, nothing ends a run whose worker was
    killed: this is how the dashboard and `eslab runs` tell it."""
    since = silent_since(run, timeout, now)
    return None if since is None else in_words((now - since).total_seconds())


def status_label(run: RunRecord, timeout: float, now: datetime) -> str:
    """The run's status, marked stale once its worker is silent past the timeout."""
    stale = stale_for(run, timeout, now)
    return (
        run.status.value
        if stale is None
        else f"{run.status.value} (stale: no heartbeat for {stale})"
    )


def in_words(seconds: float) -> str:
    """A span of time as people say it: `42 s`, `7 min`, `3 h`."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.0f} h"
