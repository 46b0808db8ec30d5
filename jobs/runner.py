"""Foreground runs: `eslab train` stores its run as running and executes it in its own
process with the same Worker as a Ray job (jobs.worker), so a foreground run heartbeats,
stops on Ctrl-C with a checkpoint, and records its outcome the same way."""

from __future__ import annotations

import uuid
from pathlib import Path

from engine.config import RunConfig
from engine.trainer import plan_total_steps
from jobs.store.records import RunRecord
from jobs.store.status import RunStatus
from jobs.store.store import Store


def default_run_name(config: RunConfig) -> str:
    task = Path(config.data.train_file or "data").parent.name or "run"
    return config.logging.run_name or f"{config.method}-{task}-{uuid.uuid4().hex[:6]}"


def create_foreground_run(store: Store, config: RunConfig, *, tags: list[str] = ()) -> RunRecord:
    """Validate everything that can be checked before training (datasets, reward function),
    then store the run as running; bad input stores nothing."""
    total = plan_total_steps(config)
    return store.create_run(name=default_run_name(config), method=config.method,
                            config=config.to_flat(), total_steps=total, tags=list(tags),
                            status=RunStatus.RUNNING)
