"""Queueing a run: the one path shared by `eslab submit` / `eslab clone` and the dashboard's
New run form, so both refuse the same bad runs the same way."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

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
    output_dir that holds another run's files, then store the run as queued (as trial
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
    refuse_taken_output_dir(store, plan)
    return create_run(store, plan)


def refuse_taken_output_dir(store: Store, plan: RunPlan) -> None:
    """A run writes checkpoints into its output_dir, deletes the older ones
    (save_total_limit) and saves its final model there: a folder that is, holds or lies in
    another stored run's (of any status: a finished run's model and checkpoints are kept for
    good), or that already holds a model or checkpoints (a deleted or foreground run's), is
    not this run's to write. Folders are compared after resolving `..` and symbolic links.
    A resumed run keeps its folder: it is queued again, not through here."""
    from engine.paths import resolve_path

    mine = plan.output_dir.resolve()
    for run_id, status, theirs in store.output_dirs():
        if (relation := _relation(mine, resolve_path(theirs).resolve())) is not None:
            _refuse(plan, f"{relation} run {run_id} ({status})")
    if held := _run_files(mine):
        _refuse(plan, f"already holds {held}, which no new run may write over")


def _relation(mine: Path, theirs: Path) -> str | None:
    """How output folder `mine` meets another run's, None when they are apart."""
    if mine == theirs:
        return "is in use by"
    if theirs.is_relative_to(mine):
        return "holds the output folder of"
    if mine.is_relative_to(theirs):
        return "lies in the output folder of"
    return None


def _run_files(folder: Path) -> str | None:
    """What in `folder` a run's saves would overwrite or rotate away: a model (config.json,
    weights) or checkpoints; None when there is nothing of the kind."""
    from engine.trainer.checkpoints import list_checkpoints

    found = [p.name for p in (folder / "config.json", *folder.glob("*.safetensors")) if p.is_file()]
    found += [p.name for p in list_checkpoints(folder)]
    return ", ".join(sorted(found)[:3]) or None


def _refuse(plan: RunPlan, problem: str) -> NoReturn:
    message = (
        f"data.output_dir {plan.config['output_dir']} {problem}; give this run a folder of "
        "its own, e.g. --set output_dir=data/runs/NEW_NAME"
    )
    raise ConfigError([FieldError("output_dir", message)])
