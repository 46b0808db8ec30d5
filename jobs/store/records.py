"""Plain records the store hands out; ORM rows never leave jobs.store."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from jobs.store.status import RunStatus, SweepStatus


@dataclass(frozen=True)
class RunRecord:
    id: int
    uuid: str
    name: str
    method: str
    status: RunStatus
    config: dict[str, Any]
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    heartbeat_at: datetime | None
    step: int
    total_steps: int | None
    error: str | None
    tags: list[str]
    notes: str
    parent_id: int | None
    ray_submission_id: str | None
    attempt: int = 1
    sweep_id: int | None = None
    """The sweep the run is a trial of (jobs.sweeps), and the trial's number in it."""
    sweep_trial: int | None = None


@dataclass(frozen=True)
class RunSign:
    """What a live page shows of a run that changes while it trains: the dashboard compares
    these, not whole pages, to know when a viewer's page needs redrawing (app/live.py)."""

    id: int
    status: RunStatus
    step: int
    events: int
    started_at: datetime | None
    heartbeat_at: datetime | None


@dataclass(frozen=True)
class RunSigns:
    """The signs of some runs, how many runs there are and the newest one's id (a run
    submitted or deleted changes the Runs page), and the database's time (heartbeats are
    written in it: jobs.liveness)."""

    runs: tuple[RunSign, ...]
    count: int
    newest: int | None
    now: datetime


@dataclass(frozen=True)
class SweepRecord:
    """A sweep: `spec` is SweepSpec.to_dict() (jobs.sweeps.spec), `base_config` the
    RunConfig.to_dict() its trials vary, paths resolved as a run stores them."""

    id: int
    name: str
    status: SweepStatus
    method: str
    spec: dict[str, Any]
    base_config: dict[str, Any]
    created_at: datetime
    updated_at: datetime
    created_by: str | None
    tags: list[str]
    """Labels each of its runs gets besides `sweep:NAME` (jobs.sweeps.driver.trial_tags)."""


@dataclass(frozen=True)
class MetricPoint:
    step: int
    value: float
    wall_time: float


@dataclass(frozen=True)
class EventRecord:
    created_at: datetime
    level: str
    message: str


@dataclass(frozen=True)
class CheckpointRecord:
    step: int
    path: str
    created_at: datetime


@dataclass(frozen=True)
class LockRecord:
    """Who holds a lock (the scheduler's) and until when."""

    name: str
    owner: str
    acquired_at: datetime
    expires_at: datetime


@dataclass(frozen=True)
class RunExport:
    """Everything a run recorded, at full resolution, as plain rows (`eslab export`)."""

    run: RunRecord
    metrics: list[dict[str, Any]]
    population: list[dict[str, Any]]
    samples: list[dict[str, Any]]
    checkpoints: list[CheckpointRecord]
    events: list[EventRecord]
