"""The one owner of the database (the MLflow tracking-store pattern): every public method
opens a managed session that commits or rolls back, turns driver errors into StoreError,
and returns plain records."""

from __future__ import annotations

import uuid as uuid_lib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Engine, String, case, cast, delete, func, or_, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import OperationalError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from engine.sink import SampleRecord, StepReport
from jobs.store import models
from jobs.store.database import describe, make_engine
from jobs.store.errors import InvalidTransitionError, RunNotFoundError, StoreError
from jobs.store.migrate import require_current_schema
from jobs.store.records import (
    CheckpointRecord,
    EventRecord,
    LockRecord,
    MetricPoint,
    RunExport,
    RunRecord,
)
from jobs.store.status import RunStatus, can_transition


def utcnow() -> datetime:
    return datetime.now(UTC)


class Store:
    def __init__(self, url: str | None = None, *, check_schema: bool = True) -> None:
        self.engine: Engine = make_engine(url)
        if check_schema:
            require_current_schema(self.engine)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)

    def close(self) -> None:
        self.engine.dispose()

    @contextmanager
    def _session(self) -> Iterator[Session]:
        session = self._sessions()
        try:
            yield session
            session.commit()
        except OperationalError as exc:
            session.rollback()
            raise StoreError(
                f"database {describe(str(self.engine.url))} failed: {exc.orig}"
            ) from exc
        except SQLAlchemyError as exc:
            session.rollback()
            raise StoreError(f"database error: {exc}") from exc
        except BaseException:
            session.rollback()
            raise
        finally:
            session.close()

    # -- runs ---------------------------------------------------------------------------

    def create_run(
        self,
        *,
        name: str,
        method: str,
        config: dict[str, Any],
        total_steps: int | None = None,
        tags: Sequence[str] = (),
        notes: str = "",
        parent_id: int | None = None,
        status: RunStatus = RunStatus.QUEUED,
    ) -> RunRecord:
        now = utcnow()
        row = models.Run(
            uuid=str(uuid_lib.uuid4()),
            name=name,
            method=method,
            status=status.value,
            config=config,
            created_at=now,
            step=0,
            total_steps=total_steps,
            tags=list(tags),
            notes=notes,
            parent_id=parent_id,
            started_at=now if status is RunStatus.RUNNING else None,
        )
        with self._session() as s:
            s.add(row)
            s.flush()
            return _run_record(row)

    def get_run(self, run: int | str) -> RunRecord:
        with self._session() as s:
            return _run_record(_find_run(s, run))

    def list_runs(self, *, limit: int = 100, offset: int = 0) -> list[RunRecord]:
        with self._session() as s:
            rows = s.scalars(
                select(models.Run)
                .order_by(models.Run.created_at.desc(), models.Run.id.desc())
                .limit(limit)
                .offset(offset)
            )
            return [_run_record(r) for r in rows]

    def count_runs(self) -> int:
        with self._session() as s:
            return s.scalar(select(func.count()).select_from(models.Run)) or 0

    def set_status(
        self, run: int | str, status: RunStatus, *, error: str | None = None
    ) -> RunRecord:
        with self._session() as s:
            row = _find_run(s, run)
            current = RunStatus(row.status)
            if current != status and not can_transition(current, status):
                raise InvalidTransitionError(
                    f"run {row.id} cannot go from {current.value} to {status.value}"
                )
            row.status = status.value
            now = utcnow()
            if status is RunStatus.RUNNING and row.started_at is None:
                row.started_at = now
            if status.is_terminal():
                row.finished_at = now
            elif status is RunStatus.QUEUED:
                row.finished_at = None
            if error is not None:
                row.error = error
            return _run_record(row)

    def heartbeat(self, run: int | str, step: int | None = None) -> None:
        with self._session() as s:
            row = _find_run(s, run)
            row.heartbeat_at = utcnow()
            if step is not None:
                row.step = step

    # -- what a step reports ------------------------------------------------------------

    def record_step(self, run: int | str, report: StepReport) -> None:
        """Metrics, population rows and samples of one step, in one transaction. Writing a
        step again replaces its metrics and population rows (a resumed run rewrites the
        steps after its checkpoint), never duplicates them."""
        with self._session() as s:
            row = _find_run(s, run)
            metric_rows = [
                {
                    "run_id": row.id,
                    "key": k,
                    "step": report.step,
                    "value": float(v),
                    "wall_time": report.wall_time,
                }
                for k, v in report.metrics.items()
            ]
            if metric_rows:
                _upsert(s, models.Metric, metric_rows, ["run_id", "key", "step"])
                _upsert(s, models.LatestMetric, metric_rows, ["run_id", "key"], only_if_newer=True)
            if report.population:
                _upsert(
                    s,
                    models.PopulationMember,
                    [
                        {"run_id": row.id, "step": report.step, **asdict(p)}
                        for p in report.population
                    ],
                    ["run_id", "step", "member"],
                )
            s.add_all(
                models.Sample(run_id=row.id, step=report.step, **asdict(x)) for x in report.samples
            )
            row.step = max(row.step, report.step)
            row.heartbeat_at = utcnow()

    def truncate_after(self, run: int | str, step: int) -> None:
        """Forget everything a dead attempt wrote after `step` (resume from a checkpoint)."""
        with self._session() as s:
            _truncate_after(s, _find_run(s, run), step)

    def metric_keys(self, run: int | str) -> list[str]:
        with self._session() as s:
            row = _find_run(s, run)
            return list(
                s.scalars(
                    select(models.LatestMetric.key)
                    .where(models.LatestMetric.run_id == row.id)
                    .order_by(models.LatestMetric.key)
                )
            )

    def metric_series(self, run: int | str, key: str) -> list[MetricPoint]:
        with self._session() as s:
            row = _find_run(s, run)
            rows = s.execute(
                select(models.Metric.step, models.Metric.value, models.Metric.wall_time)
                .where(models.Metric.run_id == row.id, models.Metric.key == key)
                .order_by(models.Metric.step)
            )
            return [MetricPoint(step=r.step, value=r.value, wall_time=r.wall_time) for r in rows]

    def latest_metrics(self, run_ids: Sequence[int]) -> dict[int, dict[str, float]]:
        with self._session() as s:
            rows = s.execute(
                select(models.LatestMetric).where(models.LatestMetric.run_id.in_(run_ids))
            ).scalars()
            out: dict[int, dict[str, float]] = {i: {} for i in run_ids}
            for m in rows:
                out[m.run_id][m.key] = m.value
            return out

    def population(self, run: int | str, step: int) -> list[dict[str, Any]]:
        with self._session() as s:
            row = _find_run(s, run)
            rows = s.scalars(
                select(models.PopulationMember)
                .where(
                    models.PopulationMember.run_id == row.id, models.PopulationMember.step == step
                )
                .order_by(models.PopulationMember.member)
            )
            return [
                {
                    "member": p.member,
                    "seed": p.seed,
                    "fitness": p.fitness,
                    "shaped_fitness": p.shaped_fitness,
                    "reward": p.reward,
                    "cost": p.cost,
                }
                for p in rows
            ]

    def samples(self, run: int | str, *, split: str, step: int) -> list[SampleRecord]:
        with self._session() as s:
            row = _find_run(s, run)
            rows = s.scalars(
                select(models.Sample)
                .where(
                    models.Sample.run_id == row.id,
                    models.Sample.split == split,
                    models.Sample.step == step,
                )
                .order_by(models.Sample.prompt_index, models.Sample.sample_index, models.Sample.id)
            )
            return [
                SampleRecord(
                    split=x.split,
                    prompt_index=x.prompt_index,
                    sample_index=x.sample_index,
                    prompt=x.prompt,
                    completion=x.completion,
                    reward=x.reward,
                    reward_parts=dict(x.reward_parts or {}),
                    member=x.member,
                    logprob=x.logprob,
                    kept=x.kept,
                    dropped_by=x.dropped_by,
                )
                for x in rows
            ]

    # -- checkpoints and events ---------------------------------------------------------

    def add_checkpoint(self, run: int | str, step: int, path: str) -> None:
        with self._session() as s:
            row = _find_run(s, run)
            _upsert(
                s,
                models.Checkpoint,
                [{"run_id": row.id, "step": step, "path": path, "created_at": utcnow()}],
                ["run_id", "step"],
            )

    def checkpoints(self, run: int | str) -> list[CheckpointRecord]:
        with self._session() as s:
            row = _find_run(s, run)
            rows = s.scalars(
                select(models.Checkpoint)
                .where(models.Checkpoint.run_id == row.id)
                .order_by(models.Checkpoint.step)
            )
            return [
                CheckpointRecord(step=c.step, path=c.path, created_at=c.created_at) for c in rows
            ]

    def add_event(self, run: int | str, level: str, message: str) -> None:
        with self._session() as s:
            row = _find_run(s, run)
            s.add(models.Event(run_id=row.id, created_at=utcnow(), level=level, message=message))

    def events(self, run: int | str) -> list[EventRecord]:
        with self._session() as s:
            row = _find_run(s, run)
            rows = s.scalars(
                select(models.Event)
                .where(models.Event.run_id == row.id)
                .order_by(models.Event.created_at, models.Event.id)
            )
            return [
                EventRecord(created_at=e.created_at, level=e.level, message=e.message) for e in rows
            ]

    # ==================================================================================
    # Queue, cancel, resume, export and the scheduler lock (the jobs issue): what the
    # scheduler, the worker and the CLI need. Every status change in this section is a
    # conditional UPDATE (`... WHERE status IN (...)`, see _compare_and_set) so that two
    # writers racing, such as a cancel and a worker starting, or a worker finishing and the
    # scheduler declaring it dead, cannot both win, on SQLite as on PostgreSQL.
    # ==================================================================================

    def queued_runs(self, *, limit: int = 100) -> list[RunRecord]:
        """Queued runs not yet handed to Ray, oldest first: the queue is first in, first out."""
        with self._session() as s:
            rows = s.scalars(
                select(models.Run)
                .where(
                    models.Run.status == RunStatus.QUEUED.value,
                    models.Run.ray_submission_id.is_(None),
                )
                .order_by(models.Run.created_at, models.Run.id)
                .limit(limit)
            )
            return [_run_record(r) for r in rows]

    def active_runs(self) -> list[RunRecord]:
        """Runs that hold a Ray job or are about to: submitted but not yet started by their
        worker (queued with a submission id), running, and cancelling."""
        run = models.Run
        with self._session() as s:
            rows = s.scalars(
                select(run)
                .where(
                    run.status.in_([RunStatus.RUNNING.value, RunStatus.CANCELLING.value])
                    | ((run.status == RunStatus.QUEUED.value) & run.ray_submission_id.is_not(None))
                )
                .order_by(run.created_at, run.id)
            )
            return [_run_record(r) for r in rows]

    def mark_submitted(self, run: int | str, submission_id: str) -> bool:
        """Note the Ray submission id *before* submitting, so that a crash between the two
        leaves a trace the next tick can check with Ray. False when the run is no longer
        queued (cancelled meanwhile) or was already submitted."""
        with self._session() as s:
            row = _find_run(s, run)
            return _compare_and_set(
                s,
                row.id,
                [RunStatus.QUEUED],
                {"ray_submission_id": submission_id},
                extra=models.Run.ray_submission_id.is_(None),
            )

    def clear_submission(self, run: int | str) -> None:
        """Undo mark_submitted when Ray could not take the job, so the next tick retries."""
        with self._session() as s:
            row = _find_run(s, run)
            _compare_and_set(s, row.id, [RunStatus.QUEUED], {"ray_submission_id": None})

    def start_run(self, run: int | str) -> bool:
        """queued -> running, as the worker starts; False when the run was cancelled first."""
        with self._session() as s:
            row = _find_run(s, run)
            now = utcnow()
            return _compare_and_set(
                s,
                row.id,
                [RunStatus.QUEUED],
                {
                    "status": RunStatus.RUNNING.value,
                    "heartbeat_at": now,
                    "started_at": func.coalesce(models.Run.started_at, now),
                },
            )

    def finish_run(self, run: int | str, status: RunStatus, *, error: str | None = None) -> bool:
        """End a run that has not ended yet. False when it had already ended (a late write
        of a dying worker, or the scheduler and the worker both noticing the end): the
        first outcome recorded is the one that stays."""
        if not status.is_terminal():
            raise ValueError(f"finish_run needs a terminal status, got {status.value}")
        sources = [x for x in RunStatus if not x.is_terminal() and can_transition(x, status)]
        values: dict[str, Any] = {"status": status.value, "finished_at": utcnow()}
        if error is not None:
            values["error"] = error
        with self._session() as s:
            row = _find_run(s, run)
            return _compare_and_set(s, row.id, sources, values)

    def beat(self, run: int | str) -> RunStatus:
        """The worker's background heartbeat: proves the process lives even while one step
        takes minutes, and tells it the run's status (a cancel request shows here)."""
        with self._session() as s:
            row = _find_run(s, run)
            row.heartbeat_at = utcnow()
            return RunStatus(row.status)

    def request_cancel(self, run: int | str) -> RunRecord:
        """A queued run is cancelled at once (its worker, if Ray started one, sees that and
        exits); a running one becomes cancelling until its worker stops."""
        for _ in range(5):  # each retry follows a concurrent status change
            with self._session() as s:
                row = _find_run(s, run)
                status = RunStatus(row.status)
                if status is RunStatus.CANCELLING:
                    return _run_record(row)
                if status.is_terminal():
                    raise InvalidTransitionError(
                        f"run {row.id} already {status.value}; there is nothing to cancel"
                    )
                target = RunStatus.CANCELLED if status is RunStatus.QUEUED else RunStatus.CANCELLING
                values: dict[str, Any] = {"status": target.value}
                if target is RunStatus.CANCELLED:
                    values["finished_at"] = utcnow()
                if _compare_and_set(s, row.id, [status], values):
                    s.add(
                        _event(
                            row.id, "info", f"cancel requested ({status.value} -> {target.value})"
                        )
                    )
                    s.flush()
                    s.refresh(row)
                    return _run_record(row)
        raise StoreError(f"run {run} kept changing status while being cancelled; try again")

    def resume_run(self, run: int | str, step: int) -> RunRecord:
        """Queue a failed or cancelled run again as its next attempt, continuing from the
        checkpoint of `step` (0: from the start). What the dead attempt wrote after `step`
        is deleted in the same transaction, so the new attempt replaces it rather than
        duplicating it."""
        with self._session() as s:
            row = _find_run(s, run)
            status = RunStatus(row.status)
            if status not in (RunStatus.FAILED, RunStatus.CANCELLED):
                hint = (
                    "; `eslab clone` starts a new run from its configuration"
                    if status is RunStatus.SUCCEEDED
                    else ""
                )
                raise InvalidTransitionError(
                    f"run {row.id} is {status.value}; only a failed or cancelled run can be "
                    f"resumed{hint}"
                )
            attempt = (row.attempt or 1) + 1
            if not _compare_and_set(
                s,
                row.id,
                [status],
                {
                    "status": RunStatus.QUEUED.value,
                    "attempt": attempt,
                    "error": None,
                    "ray_submission_id": None,
                    "finished_at": None,
                    "heartbeat_at": None,
                },
            ):
                raise StoreError(f"run {row.id} changed status while being resumed; try again")
            s.refresh(row)
            _truncate_after(s, row, step)
            where = f"its checkpoint of step {step}" if step else "the start"
            s.add(_event(row.id, "info", f"attempt {attempt} queued: resumes from {where}"))
            s.flush()
            return _run_record(row)

    def export_run(self, run: int | str) -> RunExport:
        """Every metric, population row and sample of a run, unsampled (`eslab export`)."""
        with self._session() as s:
            row = _find_run(s, run)

            def rows(table: type[models.Base], *order: Any) -> list[dict[str, Any]]:
                columns = [c for c in table.__table__.columns if c.name not in ("run_id", "id")]
                result = s.execute(select(*columns).where(table.run_id == row.id).order_by(*order))
                return [dict(r._mapping) for r in result]

            metric, member, sample = models.Metric, models.PopulationMember, models.Sample
            exported = RunExport(
                run=_run_record(row),
                metrics=rows(metric, metric.key, metric.step),
                population=rows(member, member.step, member.member),
                samples=rows(
                    sample,
                    sample.step,
                    sample.split,
                    sample.prompt_index,
                    sample.sample_index,
                    sample.id,
                ),
                checkpoints=[],
                events=[],
            )
        return replace(exported, checkpoints=self.checkpoints(row.id), events=self.events(row.id))

    def acquire_lock(self, name: str, owner: str, lease_seconds: float) -> bool:
        """Take the lock `name` or renew it; True while `owner` holds it. A lock whose lease
        has expired is free: its holder died or stopped renewing."""
        now = utcnow()
        expires = now + timedelta(seconds=lease_seconds)
        lock = models.SchedulerLock
        with self._session() as s:
            renewed = s.execute(
                update(lock)
                .where(lock.name == name, (lock.owner == owner) | (lock.expires_at < now))
                .values(
                    owner=owner,
                    expires_at=expires,
                    acquired_at=case((lock.owner == owner, lock.acquired_at), else_=now),
                )
                .execution_options(synchronize_session=False)
            )
            if renewed.rowcount:
                return True
            inserted = s.execute(
                _insert(s, lock)
                .values(name=name, owner=owner, acquired_at=now, expires_at=expires)
                .on_conflict_do_nothing(index_elements=["name"])
                .returning(lock.name)  # rowcount of an ignored insert is -1 on psycopg
            )
            return inserted.first() is not None

    def lock_holder(self, name: str) -> LockRecord | None:
        with self._session() as s:
            row = s.get(models.SchedulerLock, name)
            if row is None:
                return None
            return LockRecord(
                name=row.name,
                owner=row.owner,
                acquired_at=_aware(row.acquired_at),
                expires_at=_aware(row.expires_at),
            )

    def release_lock(self, name: str, owner: str) -> None:
        """Give the lock up at once (a clean shutdown), so a successor need not wait for the
        lease to expire."""
        lock = models.SchedulerLock
        with self._session() as s:
            s.execute(delete(lock).where(lock.name == name, lock.owner == owner))

    # -- dashboard (app/): run search, chart data reduced in SQL, delete ---------------------

    RUN_ORDERS = ("created_at", "name", "status", "method", "step")

    def delete_run(self, run: int | str) -> None:
        """Remove a finished run and everything it recorded (rows cascade); a queued or live
        run must be cancelled first. Files under its output_dir are left alone."""
        with self._session() as s:
            row = _find_run(s, run)
            if not RunStatus(row.status).is_terminal():
                raise InvalidTransitionError(
                    f"run {row.id} is {row.status}: cancel it before deleting it")
            s.delete(row)

    def search_runs(
        self,
        *,
        text: str = "",
        statuses: Sequence[str] = (),
        methods: Sequence[str] = (),
        tag: str = "",
        order: str = "-created_at",
        limit: int = 50,
        offset: int = 0,
    ) -> tuple[list[RunRecord], int]:
        """One page of runs matching the filters, and how many match in all. `text` matches
        the name, uuid or id; `order` is a RUN_ORDERS column, `-` first for descending."""
        column = order.lstrip("-")
        if column not in self.RUN_ORDERS:
            raise ValueError(f"cannot sort runs by {order!r}; choose one of {self.RUN_ORDERS}")
        run = models.Run
        where: list[Any] = []
        if text.strip():
            needle = text.strip()
            match = [run.name.ilike(f"%{needle}%"), run.uuid.startswith(needle.lower())]
            if needle.isdigit():
                match.append(run.id == int(needle))
            where.append(or_(*match))
        if statuses:
            where.append(run.status.in_(list(statuses)))
        if methods:
            where.append(run.method.in_(list(methods)))
        if tag.strip():
            # tags is a JSON list; its text form holds each tag quoted, on SQLite and PostgreSQL.
            where.append(cast(run.tags, String).like(f'%"{tag.strip()}"%'))
        key = getattr(run, column)
        sort = [key.desc() if order.startswith("-") else key.asc(), run.id.desc()]
        with self._session() as s:
            total = s.scalar(select(func.count()).select_from(run).where(*where)) or 0
            rows = s.scalars(select(run).where(*where).order_by(*sort).limit(limit).offset(offset))
            return [_run_record(r) for r in rows], total

    def sparklines(self, run_ids: Sequence[int], key: str, points: int = 30
                   ) -> dict[int, list[float]]:
        """About `points` bucket means of metric `key` per run, bucketed by step in SQL (the
        latest step comes from latest_metrics, so no run's series is read whole)."""
        m, latest = models.Metric, models.LatestMetric
        bucket = (m.step * points // (latest.step + 1)).label("bucket")
        query = (
            select(m.run_id, bucket, func.avg(m.value))
            .join(latest, (latest.run_id == m.run_id) & (latest.key == m.key))
            .where(m.run_id.in_(list(run_ids)), m.key == key)
            .group_by(m.run_id, bucket)
            .order_by(m.run_id, bucket)
        )
        out: dict[int, list[float]] = {i: [] for i in run_ids}
        with self._session() as s:
            for run_id, _, value in s.execute(query):
                out[run_id].append(float(value))
        return out

    def best_metrics(self, run_ids: Sequence[int], key: str) -> dict[int, float]:
        """The highest value of metric `key` per run (runs without it are left out)."""
        m = models.Metric
        with self._session() as s:
            rows = s.execute(select(m.run_id, func.max(m.value))
                             .where(m.run_id.in_(list(run_ids)), m.key == key)
                             .group_by(m.run_id))
            return {run_id: float(value) for run_id, value in rows}

    def metric_buckets(self, run: int | str, key: str, points: int = 400) -> list[dict[str, Any]]:
        """Metric `key` reduced in SQL to at most `points` step buckets, each with its first
        step, mean, min, max, last value and last wall time: spikes survive (min/max), the
        line ends where the run is (last), rows stay few."""
        m = models.Metric
        with self._session() as s:
            row = _find_run(s, run)
            span = s.execute(
                select(func.min(m.step), func.max(m.step)).where(m.run_id == row.id, m.key == key)
            ).one()
            if span[0] is None:
                return []
            width = max(1, -(-(span[1] - span[0] + 1) // points))
            bucket = ((m.step - span[0]) // width).label("bucket")
            agg = (
                select(bucket, func.min(m.step).label("first"), func.max(m.step).label("end"),
                       func.avg(m.value).label("mean"), func.min(m.value).label("low"),
                       func.max(m.value).label("high"), func.max(m.wall_time).label("wall"))
                .where(m.run_id == row.id, m.key == key)
                .group_by(bucket)
                .subquery()
            )
            rows = s.execute(
                select(agg.c.first, agg.c.mean, agg.c.low, agg.c.high, agg.c.wall, m.value)
                .join(m, (m.run_id == row.id) & (m.key == key) & (m.step == agg.c.end))
                .order_by(agg.c.bucket)
            )
            return [
                {"step": r[0], "value": float(r[1]), "min": float(r[2]), "max": float(r[3]),
                 "wall_time": float(r[4]), "last": float(r[5])}
                for r in rows
            ]

    def population_points(self, run: int | str, max_points: int = 3000) -> list[dict[str, Any]]:
        """(step, member, fitness) rows of every `stride`-th step, the stride chosen in SQL so
        that at most about `max_points` rows come back."""
        p = models.PopulationMember
        with self._session() as s:
            row = _find_run(s, run)
            total = s.scalar(select(func.count()).select_from(p).where(p.run_id == row.id)) or 0
            stride = max(1, -(-total // max_points))
            rows = s.execute(
                select(p.step, p.member, p.fitness, p.shaped_fitness)
                .where(p.run_id == row.id, p.step % stride == 0)
                .order_by(p.step, p.member)
            )
            return [{"step": r[0], "member": r[1], "fitness": r[2], "shaped_fitness": r[3]}
                    for r in rows]

    def sample_steps(self, run: int | str, split: str) -> list[int]:
        """The steps at which samples of `split` were recorded."""
        x = models.Sample
        with self._session() as s:
            row = _find_run(s, run)
            return list(s.scalars(select(x.step).where(x.run_id == row.id, x.split == split)
                                  .distinct().order_by(x.step)))

    def population_steps(self, run: int | str) -> list[int]:
        p = models.PopulationMember
        with self._session() as s:
            row = _find_run(s, run)
            return list(s.scalars(select(p.step).where(p.run_id == row.id)
                                  .distinct().order_by(p.step)))


def _find_run(session: Session, run: int | str) -> models.Run:
    """A run by its integer id, its uuid, or a unique uuid prefix (what the CLI prints)."""
    if isinstance(run, int) or (isinstance(run, str) and run.isdigit()):
        row = session.get(models.Run, int(run))
    else:
        matches = session.scalars(
            select(models.Run).where(models.Run.uuid.startswith(run)).limit(2)
        ).all()
        if len(matches) > 1:
            raise RunNotFoundError(f"run id {run!r} is ambiguous; give more of the uuid")
        row = matches[0] if matches else None
    if row is None:
        raise RunNotFoundError(f"no run {run!r} in this database; `eslab runs` lists them")
    return row


def _truncate_after(s: Session, row: models.Run, step: int) -> None:
    """The body of Store.truncate_after, on the caller's session so that a resume truncates
    and requeues in one transaction."""
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


def _compare_and_set(
    session: Session,
    run_id: int,
    sources: Sequence[RunStatus],
    values: dict[str, Any],
    *,
    extra: Any = None,
) -> bool:
    """UPDATE runs SET values WHERE id = run_id AND status IN sources: the status test and
    the write are one statement, so a concurrent writer cannot slip in between."""
    where = [models.Run.id == run_id, models.Run.status.in_([x.value for x in sources])]
    if extra is not None:
        where.append(extra)
    result = session.execute(
        update(models.Run)
        .where(*where)
        .values(**values)
        .execution_options(synchronize_session=False)
    )
    return result.rowcount == 1


def _event(run_id: int, level: str, message: str) -> models.Event:
    return models.Event(run_id=run_id, created_at=utcnow(), level=level, message=message)


def _insert(session: Session, table: type[models.Base]) -> Any:
    """INSERT with the dialect's ON CONFLICT support (SQLite and PostgreSQL share it)."""
    dialect = session.get_bind().dialect.name
    if dialect == "sqlite":
        return sqlite_insert(table)
    if dialect == "postgresql":
        return pg_insert(table)
    raise StoreError(f"database dialect {dialect!r} is not supported (use SQLite or PostgreSQL)")


def _run_record(row: models.Run) -> RunRecord:
    return RunRecord(
        id=row.id,
        uuid=row.uuid,
        name=row.name,
        method=row.method,
        status=RunStatus(row.status),
        config=dict(row.config),
        created_at=_aware(row.created_at),
        started_at=_aware(row.started_at),
        finished_at=_aware(row.finished_at),
        heartbeat_at=_aware(row.heartbeat_at),
        step=row.step,
        total_steps=row.total_steps,
        error=row.error,
        tags=list(row.tags or []),
        notes=row.notes or "",
        parent_id=row.parent_id,
        ray_submission_id=row.ray_submission_id,
        attempt=row.attempt or 1,
    )


def _aware(value: datetime | None) -> datetime | None:
    """SQLite hands back naive datetimes; every time we store is UTC."""
    if value is not None and value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value


def _upsert(
    session: Session,
    table: type[models.Base],
    rows: list[dict[str, Any]],
    keys: list[str],
    *,
    only_if_newer: bool = False,
) -> None:
    dialect = session.get_bind().dialect.name
    if dialect == "sqlite":
        stmt = sqlite_insert(table)
    elif dialect == "postgresql":
        stmt = pg_insert(table)
    else:
        raise StoreError(
            f"database dialect {dialect!r} is not supported (use SQLite or PostgreSQL)"
        )
    updates = {c: stmt.excluded[c] for c in rows[0] if c not in keys}
    where = (table.__table__.c.step <= stmt.excluded.step) if only_if_newer else None
    session.execute(
        stmt.on_conflict_do_update(index_elements=keys, set_=updates, where=where), rows
    )
