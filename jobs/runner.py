"""Foreground runs: `eslab train` stores its run as running and executes it in its own
process with the same Worker as a Ray job (jobs.worker), so a foreground run heartbeats,
stops on Ctrl-C with a checkpoint, and records its outcome the same way (jobs.outcome)."""

from __future__ import annotations

from collections.abc import Sequence

from engine.config import RunConfig
from jobs.planning import create_run, plan_run
from jobs.store.records import RunRecord
from jobs.store.status import RunStatus
from jobs.store.store import Store


def create_foreground_run(
    store: Store, config: RunConfig, *, tags: Sequence[str] = ()
) -> RunRecord:
    """Validate everything that can be checked before training (jobs.planning), then store
    the run as running; bad input stores nothing."""
    return create_run(store, plan_run(config, tags=tags), status=RunStatus.RUNNING)
