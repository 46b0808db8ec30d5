"""Runs themselves: create one (a clone names the run it copies as its parent, a sweep's trial
its sweep), find it, list and search runs for the CLI and the dashboard, move its status,
delete it."""

from __future__ import annotations

import uuid as uuid_lib
from collections.abc import Sequence
from typing import Any

from sqlalchemy import String, cast, func, or_, select
from sqlalchemy.exc import IntegrityError

from jobs.store import models
from jobs.store.errors import InvalidTransitionError, TrialTakenError
from jobs.store.records import RunRecord
from jobs.store.rows import find_run, plain_id, run_record, utcnow
from jobs.store.session import StoreBase
from jobs.store.status import RunStatus, can_transition
from jobs.store.sweeps import join_sweep


class Runs(StoreBase):
    RUN_ORDERS = ("created_at", "name", "status", "method", "step")

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
        sweep_id: int | None = None,
        sweep_trial: int | None = None,
    ) -> RunRecord:
        """A trial of a sweep (`sweep_id` and `sweep_trial`) is stored only while its sweep
        is active (SweepClosedError) and only once (TrialTakenError)."""
        if (sweep_id is None) != (sweep_trial is None):
            raise ValueError("a sweep's run needs both sweep_id and sweep_trial")
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
            sweep_id=sweep_id,
            sweep_trial=sweep_trial,
        )
        with self._session() as s:
            if sweep_id is not None:
                join_sweep(s, sweep_id)
            s.add(row)
            try:
                s.flush()
            except IntegrityError:
                if sweep_id is None:
                    raise
                raise TrialTakenError(
                    f"trial {sweep_trial} of sweep {sweep_id} has its run already"
                ) from None
            return run_record(row)

    def get_run(self, run: int | str) -> RunRecord:
        with self._session() as s:
            return run_record(find_run(s, run))

    def list_runs(self, *, limit: int = 100, offset: int = 0) -> list[RunRecord]:
        with self._session() as s:
            rows = s.scalars(
                select(models.Run)
                .order_by(models.Run.created_at.desc(), models.Run.id.desc())
                .limit(limit)
                .offset(offset)
            )
            return [run_record(r) for r in rows]

    def output_dirs(self) -> list[tuple[int, str, str]]:
        """(id, status, output_dir) of every stored run, whatever its status: the folders
        jobs.launch keeps a new run out of. Only the one option is read from each
        configuration, so this stays cheap with many runs."""
        run = models.Run
        folder = run.config["output_dir"].as_string()
        with self._session() as s:
            rows = s.execute(select(run.id, run.status, folder).where(folder.is_not(None)))
            return [(i, status, path) for i, status, path in rows if path]

    def count_runs(self) -> int:
        with self._session() as s:
            return s.scalar(select(func.count()).select_from(models.Run)) or 0

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
            if plain_id(needle):
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
            return [run_record(r) for r in rows], total

    def set_status(
        self, run: int | str, status: RunStatus, *, error: str | None = None
    ) -> RunRecord:
        with self._session() as s:
            row = find_run(s, run)
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
            return run_record(row)

    def delete_run(self, run: int | str) -> None:
        """Remove a finished run and everything it recorded (rows cascade); a queued or live
        run must be cancelled first. Files under its output_dir are left alone."""
        with self._session() as s:
            row = find_run(s, run)
            if not RunStatus(row.status).is_terminal():
                raise InvalidTransitionError(
                    f"run {row.id} is {row.status}: cancel it before deleting it"
                )
            s.delete(row)
