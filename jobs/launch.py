"""Queueing a run: the one path shared by `eslab submit` / `eslab clone` and the dashboard's
New run form, so both refuse the same bad runs the same way."""

from __future__ import annotations

from collections.abc import Sequence

from engine.config import ConfigError, FieldError, RunConfig
from jobs.store.records import RunRecord
from jobs.store.store import Store


def queue_run(store: Store, config: RunConfig, *, name: str | None = None,
              parent_id: int | None = None, tags: Sequence[str] = ()) -> RunRecord:
    """Validate what can be checked before a run starts (datasets, reward function, model
    folder), refuse an output_dir that a live run writes to, then store the run as queued.

    Raises ConfigError (naming the field), DatasetError, RewardError or ModelError."""
    from engine.paths import resolve_path
    from engine.trainer import plan_total_steps
    from jobs.runner import default_run_name

    total = plan_total_steps(config)
    output = resolve_path(config.data.output_dir)
    for other in store.active_runs() + store.queued_runs(limit=1000):
        if resolve_path(other.config.get("output_dir") or "") == output:
            raise ConfigError([FieldError("output_dir", (
                f"data.output_dir {config.data.output_dir} is in use by run {other.id} "
                f"({other.status.value}); give this run its own with --set "
                "output_dir=..."))])
    return store.create_run(name=name or default_run_name(config), method=config.method,
                            config=config.to_flat(), total_steps=total, tags=list(tags),
                            parent_id=parent_id)
