"""The one owner of the database (the MLflow tracking-store pattern): every public method
opens a managed session that commits or rolls back, turns driver errors into StoreError,
and returns plain records; ORM rows never leave jobs.store.

Callers hold one Store; its methods live with their concept, each part a class over the
shared session (session.py) and row helpers (rows.py):
- runs.py: create, find, list, search, status, delete;
- steps.py: what a training writes through the Sink (step records, checkpoints, events,
  heartbeats);
- queue.py: the queue and a run's life under racing writers (submit, start, beat, finish,
  cancel, resume);
- locks.py: the scheduler's lease;
- queries.py: reads for the dashboard, the CLI and the worker;
- sweeps.py: sweeps, their runs and their status.
"""

from __future__ import annotations

from jobs.store.locks import Locks
from jobs.store.queries import RunQueries
from jobs.store.queue import RunQueue
from jobs.store.runs import Runs
from jobs.store.steps import StepRecords
from jobs.store.sweeps import Sweeps


class Store(Runs, StepRecords, RunQueue, Locks, RunQueries, Sweeps):
    """`Store(url=None, *, check_schema=True)`: the database at `url` (else
    ESLAB_DATABASE_URL or data/eslab.db), refused unless migrated to the current schema."""
