"""The database tables, with the names that the dashboard, the worker and outside tools share
(docs/design.md). Only jobs.store imports this module; rows never leave the store."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    CheckConstraint,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from jobs.store.status import RunStatus, SweepStatus

# Named constraints keep migrations portable between SQLite and PostgreSQL.
NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

STATUS_VALUES = ", ".join(f"'{s.value}'" for s in RunStatus)
SWEEP_STATUS_VALUES = ", ".join(f"'{s.value}'" for s in SweepStatus)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


def _run_fk() -> Any:
    return ForeignKey("runs.id", ondelete="CASCADE")


class Sweep(Base):
    """A hyperparameter search over run options (migration 0004): what to search (`spec`,
    jobs.sweeps.spec.SweepSpec.to_dict()) from which configuration (`base_config`,
    RunConfig.to_dict() with its paths resolved). Its trials are ordinary runs that name it
    (`runs.sweep_id`) and carry its `tags` (migration 0005)."""

    __tablename__ = "sweeps"
    __table_args__ = (
        CheckConstraint(f"status IN ({SWEEP_STATUS_VALUES})", name="status"),
        Index("ix_sweeps_created_at", "created_at"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(200), unique=True, nullable=False)
    status: Mapped[str] = mapped_column(String(16), nullable=False)
    method: Mapped[str] = mapped_column(String(16), nullable=False)
    spec: Mapped[dict] = mapped_column(JSON, nullable=False)
    base_config: Mapped[dict] = mapped_column(JSON, nullable=False)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    # The dashboard user who started it; NULL from the command line (no login there).
    created_by: Mapped[str | None] = mapped_column(String(200))
    # Labels every run of the sweep gets besides `sweep:NAME` (migration 0005).
    tags: Mapped[list] = mapped_column(JSON, nullable=False, default=list, server_default="[]")


class Run(Base):
    __tablename__ = "runs"
    __table_args__ = (
        CheckConstraint(f"status IN ({STATUS_VALUES})", name="status"),
        CheckConstraint("method IN ('es', 'lbes')", name="method"),
        Index("ix_runs_created_at", "created_at"),
        Index("ix_runs_status", "status"),
        # One run per trial of a sweep, so a trial can never be queued twice; also the
        # index that lists a sweep's runs. NULLs are distinct: runs of no sweep never clash.
        UniqueConstraint("sweep_id", "sweep_trial"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    uuid: Mapped[str] = mapped_column(String(36), unique=True, nullable=False)
    name: Mapped[str] = mapped_column(String(200), nullable=False)
    method: Mapped[str] = mapped_column(String(16), nullable=False)
    status: Mapped[str] = mapped_column(String(16), nullable=False)
    config: Mapped[dict] = mapped_column(JSON, nullable=False)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    heartbeat_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # The progress against total_steps: the batches the worker's heartbeat counts, a skipped
    # LBES step included (engine.sink.Sink.heartbeat); metrics are at the global step.
    step: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    total_steps: Mapped[int | None] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(Text)
    tags: Mapped[list] = mapped_column(JSON, nullable=False, default=list)
    notes: Mapped[str] = mapped_column(Text, nullable=False, default="")
    parent_id: Mapped[int | None] = mapped_column(ForeignKey("runs.id", ondelete="SET NULL"))
    ray_submission_id: Mapped[str | None] = mapped_column(String(64))
    # 1 for the first attempt; `eslab resume` adds one (migration 0002).
    attempt: Mapped[int] = mapped_column(Integer, nullable=False, default=1, server_default="1")
    # The sweep the run is a trial of, and the trial's number in it (migration 0004).
    sweep_id: Mapped[int | None] = mapped_column(ForeignKey("sweeps.id", ondelete="SET NULL"))
    sweep_trial: Mapped[int | None] = mapped_column(Integer)


class Metric(Base):
    """One row per (run, key, step); the primary key is the index that serves a run's series."""

    __tablename__ = "metrics"

    run_id: Mapped[int] = mapped_column(_run_fk(), primary_key=True)
    key: Mapped[str] = mapped_column(String(200), primary_key=True)
    step: Mapped[int] = mapped_column(Integer, primary_key=True)
    value: Mapped[float] = mapped_column(Float, nullable=False)
    wall_time: Mapped[float] = mapped_column(Float, nullable=False)


class LatestMetric(Base):
    """The last value of every key of every run, so the run list never scans `metrics`
    (the fix MLflow needed, mlflow/mlflow issue 1571)."""

    __tablename__ = "latest_metrics"

    run_id: Mapped[int] = mapped_column(_run_fk(), primary_key=True)
    key: Mapped[str] = mapped_column(String(200), primary_key=True)
    step: Mapped[int] = mapped_column(Integer, nullable=False)
    value: Mapped[float] = mapped_column(Float, nullable=False)
    wall_time: Mapped[float] = mapped_column(Float, nullable=False)


class PopulationMember(Base):
    __tablename__ = "population"

    run_id: Mapped[int] = mapped_column(_run_fk(), primary_key=True)
    step: Mapped[int] = mapped_column(Integer, primary_key=True)
    member: Mapped[int] = mapped_column(Integer, primary_key=True)
    seed: Mapped[int] = mapped_column(Integer, nullable=False)
    fitness: Mapped[float | None] = mapped_column(Float)
    shaped_fitness: Mapped[float | None] = mapped_column(Float)
    reward: Mapped[float | None] = mapped_column(Float)
    cost: Mapped[float | None] = mapped_column(Float)
    # Each (prompt, sample)'s reward and cost of the member (alignment runs; migration 0003);
    # SQL NULL, not JSON null, where not recorded, so that a query can tell
    sample_rewards: Mapped[list | None] = mapped_column(JSON(none_as_null=True))
    sample_costs: Mapped[list | None] = mapped_column(JSON(none_as_null=True))


class Sample(Base):
    __tablename__ = "samples"
    __table_args__ = (
        CheckConstraint("split IN ('train', 'eval')", name="split"),
        Index("ix_samples_run_split_step", "run_id", "split", "step"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[int] = mapped_column(_run_fk(), nullable=False)
    step: Mapped[int] = mapped_column(Integer, nullable=False)
    split: Mapped[str] = mapped_column(String(8), nullable=False)
    prompt_index: Mapped[int] = mapped_column(Integer, nullable=False)
    sample_index: Mapped[int] = mapped_column(Integer, nullable=False)
    member: Mapped[int | None] = mapped_column(Integer)
    prompt: Mapped[str] = mapped_column(Text, nullable=False)
    completion: Mapped[str] = mapped_column(Text, nullable=False)
    reward: Mapped[float | None] = mapped_column(Float)
    reward_parts: Mapped[dict] = mapped_column(JSON, nullable=False, default=dict)
    logprob: Mapped[float | None] = mapped_column(Float)
    kept: Mapped[bool | None] = mapped_column(Boolean)
    dropped_by: Mapped[str | None] = mapped_column(String(64))


class Checkpoint(Base):
    __tablename__ = "checkpoints"
    __table_args__ = (UniqueConstraint("run_id", "step"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[int] = mapped_column(_run_fk(), nullable=False)
    step: Mapped[int] = mapped_column(Integer, nullable=False)
    path: Mapped[str] = mapped_column(Text, nullable=False)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)


class Event(Base):
    __tablename__ = "events"
    __table_args__ = (
        CheckConstraint("level IN ('debug', 'info', 'warning', 'error')", name="level"),
        Index("ix_events_run_created", "run_id", "created_at"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[int] = mapped_column(_run_fk(), nullable=False)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    level: Mapped[str] = mapped_column(String(8), nullable=False)
    message: Mapped[str] = mapped_column(Text, nullable=False)


class SchedulerLock(Base):
    """One row per lock: who holds it and until when. The holder renews the lease on every
    tick; anyone may take a lock whose lease has expired (its holder died)."""

    __tablename__ = "scheduler_lock"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    owner: Mapped[str] = mapped_column(String(200), nullable=False)
    acquired_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
