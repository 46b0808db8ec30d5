"""Queueing a run: the one path shared by `eslab submit` / `eslab clone` and the dashboard's
New run form, so both refuse the same bad runs the same way."""

from __future__ import annotations

from collections.abc import Sequence

from engine.config import ConfigError, FieldError, RunConfig
from jobs.planning import RunPlan, create_run, plan_run
from jobs.store.records import RunRecord
from jobs.store.store import Store


def queue_run(
    store: Store,
    config: RunConfig,
    *,
    name: str | None = None,
    parent_id: int | None = None,
    tags: Sequence[str] = (),
    sweep_id: int | None = None,
    sweep_trial: int | None = None,
) -> RunRecord:
    """Validate what can be checked before a run starts (jobs.planning), refuse an
    output_dir that a live run writes to, then store the run as queued (as trial
    `sweep_trial` of sweep `sweep_id` when given: jobs.sweeps.driver).

    Raises ConfigError (naming the field), DatasetError, RewardError or ModelError; for a
    sweep's trial also SweepClosedError or TrialTakenError (jobs.store.errors)."""
    plan = plan_run(
        config,
        name=name,
        tags=tags,
        parent_id=parent_id,
        sweep_id=sweep_id,
        sweep_trial=sweep_trial,
    )
    refuse_output_dir_in_use(store, plan)
    return create_run(store, plan)


def refuse_output_dir_in_use(store: Store, plan: RunPlan) -> None:
    """Two live runs in one folder would overwrite and prune each other's checkpoints."""
    from engine.paths import resolve_path

    for other in store.active_runs() + store.queued_runs(limit=1000):
        if resolve_path(other.config.get("output_dir") or "") == plan.output_dir:
            message = (
                f"data.output_dir {plan.config['output_dir']} is in use by run {other.id} "
                f"({other.status.value}); give this run its own with --set output_dir=..."
            )
            raise ConfigError([FieldError("output_dir", message)])
