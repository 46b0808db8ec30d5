"""What a running training writes through the Sink: each step's metrics, population rows and
samples in one transaction, checkpoints, events and heartbeats; and the undoing of steps that
a resumed run writes again.

Each write takes the writer's `attempt` (the run's attempt when its worker started) and is
fenced by it in its own transaction (fence.write_as): once a resume has started another
attempt, or the run was ended without the worker, the write is refused with
StaleAttemptError and nothing of it is kept, so a worker that was given up for dead but still
lives cannot write into its successor's attempt."""

from __future__ import annotations

from dataclasses import asdict

from sqlalchemy import case, delete, func, select
from sqlalchemy.orm import Session

from engine.sink import StepReport
from jobs.store import models
from jobs.store.fence import write_as
from jobs.store.rows import database_now, event_row, find_run, upsert, utcnow
from jobs.store.session import StoreBase


class StepRecords(StoreBase):
    def record_step(
        self, run: int | str, report: StepReport, *, attempt: int | None = None
    ) -> None:
        """Metrics, population rows and samples of one step, in one transaction. Writing a
        step again replaces its metrics and population rows (a resumed run rewrites the
        steps after its checkpoint), never duplicates them."""
        step = models.Run.step
        with self._session() as s:
            run_id = write_as(
                s,
                run,
                attempt,
                step=case((step < report.step, report.step), else_=step),
                heartbeat_at=database_now(),
            )
            metric_rows = [
                {
                    "run_id": run_id,
                    "key": k,
                    "step": report.step,
                    "value": float(v),
                    "wall_time": report.wall_time,
                }
                for k, v in report.metrics.items()
            ]
            if metric_rows:
                upsert(s, models.Metric, metric_rows, ["run_id", "key", "step"])
                upsert(s, models.LatestMetric, metric_rows, ["run_id", "key"], only_if_newer=True)
            if report.population:
                upsert(
                    s,
                    models.PopulationMember,
                    [
                        {"run_id": run_id, "step": report.step, **asdict(p)}
                        for p in report.population
                    ],
                    ["run_id", "step", "member"],
                )
            s.add_all(
                models.Sample(run_id=run_id, step=report.step, **asdict(x)) for x in report.samples
            )

    def step_recorded(self, run: int | str, report: StepReport) -> bool:
        """Whether `report` itself is in the database: a metric of its step written at its
        wall time (what a write whose commit was answered by a dropped connection left)."""
        if not report.metrics:
            return False
        metric = models.Metric
        with self._session() as s:
            run_id = find_run(s, run).id
            found = s.scalar(
                select(func.count())
                .select_from(metric)
                .where(
                    metric.run_id == run_id,
                    metric.step == report.step,
                    metric.wall_time == report.wall_time,
                )
            )
        return bool(found)

    def heartbeat(
        self, run: int | str, step: int | None = None, *, attempt: int | None = None
    ) -> None:
        values = {"heartbeat_at": database_now()} | ({} if step is None else {"step": step})
        with self._session() as s:
            write_as(s, run, attempt, **values)

    def add_checkpoint(
        self, run: int | str, step: int, path: str, *, attempt: int | None = None
    ) -> None:
        with self._session() as s:
            run_id = write_as(s, run, attempt)
            upsert(
                s,
                models.Checkpoint,
                [{"run_id": run_id, "step": step, "path": path, "created_at": utcnow()}],
                ["run_id", "step"],
            )

    def add_event(
        self, run: int | str, level: str, message: str, *, attempt: int | None = None
    ) -> None:
        """`attempt` None: a note from outside the run's attempts (the scheduler's)."""
        with self._session() as s:
            s.add(event_row(write_as(s, run, attempt), level, message))

    def truncate_after(self, run: int | str, step: int) -> None:
        """Forget everything a dead attempt wrote after `step` (resume from a checkpoint)."""
        with self._session() as s:
            forget_steps_after(s, find_run(s, run), step)


def forget_steps_after(s: Session, row: models.Run, step: int) -> None:
    """The body of truncate_after, on the caller's session so that a resume (queue.py)
    truncates and requeues in one transaction."""
    for table in (models.Metric, models.PopulationMember, models.Sample):
        s.execute(delete(table).where(table.run_id == row.id, table.step > step))
    s.execute(delete(models.LatestMetric).where(models.LatestMetric.run_id == row.id))
    latest = (
        select(models.Metric.key, func.max(models.Metric.step).label("step"))
        .where(models.Metric.run_id == row.id)
        .group_by(models.Metric.key)
        .subquery()
    )
    rows = s.execute(
        select(models.Metric)
        .join(
            latest,
            (models.Metric.key == latest.c.key) & (models.Metric.step == latest.c.step),
        )
        .where(models.Metric.run_id == row.id)
    ).scalars()
    s.add_all(
        models.LatestMetric(
            run_id=m.run_id, key=m.key, step=m.step, value=m.value, wall_time=m.wall_time
        )
        for m in rows
    )
    s.execute(
        delete(models.Checkpoint).where(
            models.Checkpoint.run_id == row.id, models.Checkpoint.step > step
        )
    )
    row.step = step
