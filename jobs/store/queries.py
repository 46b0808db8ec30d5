"""Reads of what runs recorded, for the dashboard's pages, the CLI and the worker: metric
series and latest values, chart data reduced in SQL (buckets, sparklines, best values),
population and samples by step, checkpoints, events, and a whole run's export."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from sqlalchemy import Text, cast, func, select
from sqlalchemy.orm import Session

from engine.sink import SampleRecord
from jobs.store import models
from jobs.store.records import (
    CheckpointRecord,
    EventRecord,
    MetricPoint,
    RunExport,
    RunSign,
    RunSigns,
)
from jobs.store.rows import aware, database_now, find_run, run_record
from jobs.store.session import StoreBase
from jobs.store.status import TERMINAL, RunStatus


class RunQueries(StoreBase):
    # -- metrics --------------------------------------------------------------------------

    def metric_keys(self, run: int | str) -> list[str]:
        with self._session() as s:
            row = find_run(s, run)
            return list(
                s.scalars(
                    select(models.LatestMetric.key)
                    .where(models.LatestMetric.run_id == row.id)
                    .order_by(models.LatestMetric.key)
                )
            )

    def metric_series(self, run: int | str, key: str) -> list[MetricPoint]:
        with self._session() as s:
            row = find_run(s, run)
            rows = s.execute(
                select(models.Metric.step, models.Metric.value, models.Metric.wall_time)
                .where(models.Metric.run_id == row.id, models.Metric.key == key)
                .order_by(models.Metric.step)
            )
            return [MetricPoint(step=r.step, value=r.value, wall_time=r.wall_time) for r in rows]

    def metric_curves(self, run_ids: Sequence[int], key: str) -> dict[int, dict[int, float]]:
        """Metric `key` of many runs at once, {run id: {step: value}} (a sweep's runs: its
        objective and early stopping), in one query that the metrics primary key serves.
        Runs without the metric get an empty curve."""
        m = models.Metric
        out: dict[int, dict[int, float]] = {i: {} for i in run_ids}
        with self._session() as s:
            rows = s.execute(
                select(m.run_id, m.step, m.value)
                .where(m.run_id.in_(list(run_ids)), m.key == key)
                .order_by(m.run_id, m.step)
            )
            for run_id, step, value in rows:
                out[run_id][step] = value
        return out

    def latest_metrics(self, run_ids: Sequence[int]) -> dict[int, dict[str, float]]:
        with self._session() as s:
            rows = s.execute(
                select(models.LatestMetric).where(models.LatestMetric.run_id.in_(run_ids))
            ).scalars()
            out: dict[int, dict[str, float]] = {i: {} for i in run_ids}
            for m in rows:
                out[m.run_id][m.key] = m.value
            return out

    def sparklines(
        self, run_ids: Sequence[int], key: str, points: int = 30
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
            rows = s.execute(
                select(m.run_id, func.max(m.value))
                .where(m.run_id.in_(list(run_ids)), m.key == key)
                .group_by(m.run_id)
            )
            return {run_id: float(value) for run_id, value in rows}

    def metric_buckets(self, run: int | str, key: str, points: int = 400) -> list[dict[str, Any]]:
        """Metric `key` reduced in SQL to at most `points` step buckets, each with its first
        step, mean, min, max, last value and last wall time: spikes survive (min/max), the
        line ends where the run is (last), rows stay few."""
        m = models.Metric
        with self._session() as s:
            row = find_run(s, run)
            span = s.execute(
                select(func.min(m.step), func.max(m.step)).where(m.run_id == row.id, m.key == key)
            ).one()
            if span[0] is None:
                return []
            width = max(1, -(-(span[1] - span[0] + 1) // points))
            bucket = ((m.step - span[0]) // width).label("bucket")
            agg = (
                select(
                    bucket,
                    func.min(m.step).label("first"),
                    func.max(m.step).label("end"),
                    func.avg(m.value).label("mean"),
                    func.min(m.value).label("low"),
                    func.max(m.value).label("high"),
                    func.max(m.wall_time).label("wall"),
                )
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
                {
                    "step": r[0],
                    "value": float(r[1]),
                    "min": float(r[2]),
                    "max": float(r[3]),
                    "wall_time": float(r[4]),
                    "last": float(r[5]),
                }
                for r in rows
            ]

    # -- population and samples -----------------------------------------------------------

    def population(self, run: int | str, step: int) -> list[dict[str, Any]]:
        with self._session() as s:
            row = find_run(s, run)
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

    def sample_scores(self, run: int | str, step: int) -> list[dict[str, Any]]:
        """One row per sample of each member at `step` whose samples' rewards and costs were
        recorded (alignment runs): member, fitness, reward, cost. Empty for rows written
        without them (before migration 0003, or a run without costs)."""
        p = models.PopulationMember
        with self._session() as s:
            row = find_run(s, run)
            rows = s.execute(
                select(p.member, p.fitness, p.sample_rewards, p.sample_costs)
                .where(
                    p.run_id == row.id,
                    p.step == step,
                    p.sample_rewards.is_not(None),
                    p.sample_costs.is_not(None),
                )
                .order_by(p.member)
            )
            return [
                {"member": member, "fitness": fitness, "reward": reward, "cost": cost}
                for member, fitness, rewards, costs in rows
                for reward, cost in zip(rewards, costs, strict=True)
            ]

    def population_points(self, run: int | str, max_points: int = 3000) -> list[dict[str, Any]]:
        """(step, member, seed, fitness, shaped_fitness) rows of every `stride`-th step, the
        stride chosen in SQL so that at most about `max_points` rows come back."""
        p = models.PopulationMember
        with self._session() as s:
            row = find_run(s, run)
            total = s.scalar(select(func.count()).select_from(p).where(p.run_id == row.id)) or 0
            stride = max(1, -(-total // max_points))
            rows = s.execute(
                select(p.step, p.member, p.seed, p.fitness, p.shaped_fitness)
                .where(p.run_id == row.id, p.step % stride == 0)
                .order_by(p.step, p.member)
            )
            return [
                {
                    "step": r[0],
                    "member": r[1],
                    "seed": r[2],
                    "fitness": r[3],
                    "shaped_fitness": r[4],
                }
                for r in rows
            ]

    def population_steps(self, run: int | str) -> list[int]:
        p = models.PopulationMember
        with self._session() as s:
            row = find_run(s, run)
            return list(
                s.scalars(select(p.step).where(p.run_id == row.id).distinct().order_by(p.step))
            )

    def samples(
        self, run: int | str, *, split: str, step: int, prompt: str | None = None
    ) -> list[SampleRecord]:
        """The samples of one split and step; with `prompt`, only that prompt's."""
        table = models.Sample
        with self._session() as s:
            row = find_run(s, run)
            rows = s.scalars(
                select(table)
                .where(
                    table.run_id == row.id,
                    table.split == split,
                    table.step == step,
                    *([] if prompt is None else [table.prompt == prompt]),
                )
                .order_by(table.prompt_index, table.sample_index, table.id)
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

    def sample_steps(self, run: int | str, split: str, *, prompt: str | None = None) -> list[int]:
        """The steps at which samples of `split` were recorded; with `prompt`, those at which
        that prompt was sampled (where a completion can be compared with the same prompt's
        completion at another step)."""
        x = models.Sample
        with self._session() as s:
            row = find_run(s, run)
            where = [x.run_id == row.id, x.split == split]
            if prompt is not None:
                where.append(x.prompt == prompt)
            return list(s.scalars(select(x.step).where(*where).distinct().order_by(x.step)))

    # -- checkpoints, events, export ------------------------------------------------------

    def checkpoints(self, run: int | str) -> list[CheckpointRecord]:
        with self._session() as s:
            row = find_run(s, run)
            rows = s.scalars(
                select(models.Checkpoint)
                .where(models.Checkpoint.run_id == row.id)
                .order_by(models.Checkpoint.step)
            )
            return [
                CheckpointRecord(step=c.step, path=c.path, created_at=c.created_at) for c in rows
            ]

    def events(self, run: int | str) -> list[EventRecord]:
        with self._session() as s:
            row = find_run(s, run)
            rows = s.scalars(
                select(models.Event)
                .where(models.Event.run_id == row.id)
                .order_by(models.Event.created_at, models.Event.id)
            )
            return [
                EventRecord(created_at=aware(e.created_at), level=e.level, message=e.message)
                for e in rows
            ]

    def run_signs(
        self, run_ids: Sequence[int] | None = None, sweep_ids: Sequence[int] | None = None
    ) -> RunSigns:
        """The signs of runs `run_ids`, or of the runs of sweeps `sweep_ids`, or (neither)
        of every run not yet ended, with the count of all runs, the newest id and the
        database's time. Live pages ask for it every second or so to learn whether they
        changed, so it is two indexed queries, no rows kept."""
        r, e = models.Run, models.Event
        events = select(func.count()).where(e.run_id == r.id).correlate(r).scalar_subquery()
        if run_ids is not None:
            which = r.id.in_(run_ids)
        elif sweep_ids is not None:
            which = r.sweep_id.in_(sweep_ids)
        else:
            which = r.status.not_in([s.value for s in TERMINAL])
        with self._session() as s:
            count, newest, now = s.execute(
                select(func.count(), func.max(r.id), database_now()).select_from(r)
            ).one()
            rows = s.execute(
                select(r.id, r.status, r.step, events, r.started_at, r.heartbeat_at)
                .where(which)
                .order_by(r.id)
            )
            signs = tuple(
                RunSign(i, RunStatus(status), step, n, aware(started), aware(beat))
                for i, status, step, n, started, beat in rows
            )
        return RunSigns(signs, count, newest, aware(now))

    def events_starting_with(self, run_ids: Sequence[int], prefix: str) -> dict[int, list[str]]:
        """The messages of many runs' events that start with `prefix`, oldest first, {run
        id: [message]}: an event a module writes as a mark (jobs.phases, jobs.sweeps)."""
        e = models.Event
        out: dict[int, list[str]] = {i: [] for i in run_ids}
        with self._session() as s:
            rows = s.execute(
                select(e.run_id, e.message)
                .where(e.run_id.in_(list(run_ids)), e.message.startswith(prefix, autoescape=True))
                .order_by(e.created_at, e.id)
            )
            for run_id, message in rows:
                out[run_id].append(message)
        return out

    def metric_rows(self, run: int | str) -> list[dict[str, Any]]:
        """Every metric of a run, unsampled, one row per (key, step): the metrics alone,
        without the population and samples that export_run loads too."""
        with self._session() as s:
            return _rows(s, models.Metric, find_run(s, run).id, *METRIC_ORDER)

    def export_size(self, run: int | str) -> int:
        """About how many bytes export_run's rows take as JSON (EXPORT_ROW_BYTES a row and
        the length of its texts and JSON lists), summed in the database: what a caller that
        must not hold a huge run checks before loading it."""
        with self._session() as s:
            run_id = find_run(s, run).id
            total = 0
            for table, texts in EXPORT_TEXTS.items():
                sizes = [func.coalesce(func.sum(func.length(cast(c, Text))), 0) for c in texts]
                rows, *lengths = s.execute(
                    select(func.count(), *sizes).select_from(table).where(table.run_id == run_id)
                ).one()
                total += rows * EXPORT_ROW_BYTES + sum(lengths)
            return total

    def export_run(self, run: int | str) -> RunExport:
        """Every metric, population row and sample of a run, unsampled (`eslab export`)."""
        with self._session() as s:
            row = find_run(s, run)
            member, sample = models.PopulationMember, models.Sample
            exported = RunExport(
                run=run_record(row),
                metrics=_rows(s, models.Metric, row.id, *METRIC_ORDER),
                population=_rows(s, member, row.id, member.step, member.member),
                samples=_rows(
                    s,
                    sample,
                    row.id,
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


METRIC_ORDER = (models.Metric.key, models.Metric.step)
EXPORT_ROW_BYTES = 200
"""A row's size as JSON apart from its texts: its keys, numbers and punctuation."""
EXPORT_TEXTS: dict[type[models.Base], tuple[Any, ...]] = {
    models.Metric: (),
    models.PopulationMember: (
        models.PopulationMember.sample_rewards,
        models.PopulationMember.sample_costs,
    ),
    models.Sample: (
        models.Sample.prompt,
        models.Sample.completion,
        models.Sample.reward_parts,
    ),
}
"""The exported tables and their columns whose size grows with what was recorded."""


def _rows(s: Session, table: type[models.Base], run_id: int, *order: Any) -> list[dict[str, Any]]:
    """The run's rows of `table` as plain dicts, without the run id and surrogate key."""
    columns = [c for c in table.__table__.columns if c.name not in ("run_id", "id")]
    result = s.execute(select(*columns).where(table.run_id == run_id).order_by(*order))
    return [dict(r._mapping) for r in result]
