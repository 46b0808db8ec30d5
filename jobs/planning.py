"""Planning a run before it is stored: the one place that validates a configuration and
decides the run's name, steps, tags and stored configuration (its paths resolved), for queued runs
(jobs.launch) and foreground ones (jobs.runner) alike."""

from __future__ import annotations

import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.config import ConfigError, FieldError, RunConfig
from engine.config.rules import run_name_problem
from jobs.store.records import RunRecord
from jobs.store.status import RunStatus
from jobs.store.store import Store


@dataclass(frozen=True)
class RunPlan:
    """A validated run, ready to be stored."""

    name: str
    method: str
    config: dict[str, Any]  # RunConfig.to_flat() with its paths resolved, as the database keeps it
    total_steps: int
    output_dir: Path  # resolved
    tags: list[str] = field(default_factory=list)
    parent_id: int | None = None
    sweep_id: int | None = None  # a trial of a sweep: the sweep and the trial's number
    sweep_trial: int | None = None


def default_run_name(config: RunConfig) -> str:
    """run_name, else method-task-random where task is the dataset's folder, cut down to the
    characters a run name may have."""
    folder = Path(config.data.train_file or "data").parent.name
    task = re.sub(r"[^\w.-]+", "-", folder)[:40].strip("-.") or "run"
    return config.logging.run_name or f"{config.method}-{task}-{uuid.uuid4().hex[:6]}"


def plan_run(
    config: RunConfig,
    *,
    name: str | None = None,
    tags: Sequence[str] = (),
    parent_id: int | None = None,
    sweep_id: int | None = None,
    sweep_trial: int | None = None,
) -> RunPlan:
    """Check what can be checked before a run starts (datasets, reward function, model
    folder), so that bad input stores nothing.

    Raises ConfigError (naming the field), DatasetError, RewardError or ModelError."""
    # Imported here: the dashboard imports this module, the training library only when a
    # run is planned.
    from engine.trainer import plan_total_steps

    name = name or default_run_name(config)
    if problem := run_name_problem(name):  # a name given apart from the configuration
        raise ConfigError([FieldError("run_name", f"the run name {problem}")])
    total = plan_total_steps(config)
    config = config.with_resolved_paths()  # stored as resolved: the same files on a resume
    return RunPlan(
        name=name,
        method=config.method,
        config=config.to_flat(),
        total_steps=total,
        output_dir=Path(config.data.output_dir or ""),
        tags=list(tags),
        parent_id=parent_id,
        sweep_id=sweep_id,
        sweep_trial=sweep_trial,
    )


def create_run(store: Store, plan: RunPlan, *, status: RunStatus = RunStatus.QUEUED) -> RunRecord:
    return store.create_run(
        name=plan.name,
        method=plan.method,
        config=plan.config,
        total_steps=plan.total_steps,
        tags=plan.tags,
        parent_id=plan.parent_id,
        status=status,
        sweep_id=plan.sweep_id,
        sweep_trial=plan.sweep_trial,
    )
