"""`eslab submit | runs | cancel | resume | clone`: runs on the queue, which the scheduler of
`eslab serve` runs as Ray jobs (`eslab cancel --sweep` cancels a sweep and its runs)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from app.cli.common import (
    add_set_option,
    dashboard_url,
    load_run_config,
    open_store,
    overridden,
    print_error,
    print_table,
)
from engine.config import RunConfig


def add_commands(commands: argparse._SubParsersAction) -> None:
    submit = commands.add_parser("submit", help="validate a run and queue it for `eslab serve`")
    submit.add_argument(
        "config", help="YAML file of option: value pairs (see engine/config/schema.py)"
    )
    add_set_option(submit, "override an option of the file (repeatable)")
    submit.add_argument("--tag", action="append", default=[], help="label the run (repeatable)")
    submit.set_defaults(func=cmd_submit)
    runs = commands.add_parser("runs", help="list runs: status and progress")
    runs.add_argument("--limit", type=int, default=20)
    runs.set_defaults(func=cmd_runs)
    cancel = commands.add_parser(
        "cancel", help="cancel a queued or running run, or a sweep and its runs"
    )
    cancel.add_argument("run", nargs="?", help="run id or uuid (prefix)")
    cancel.add_argument(
        "--sweep",
        metavar="ID",
        help="cancel this sweep (id or name): it queues no more runs, "
        "and its queued and running runs are cancelled",
    )
    cancel.set_defaults(func=cmd_cancel)
    resume = commands.add_parser(
        "resume", help="queue a failed or cancelled run again from its latest checkpoint"
    )
    resume.add_argument("run", help="run id or uuid (prefix)")
    resume.set_defaults(func=cmd_resume)
    clone = commands.add_parser("clone", help="queue a new run from another's configuration")
    clone.add_argument("run", help="run id or uuid (prefix) to copy")
    add_set_option(clone, "change an option (repeatable)")
    clone.set_defaults(func=cmd_clone)


def _queue(
    config: RunConfig,
    name: str | None = None,
    parent_id: int | None = None,
    tags: Sequence[str] = (),
) -> int:
    """Queue the run through jobs.launch (the path the dashboard uses too) and print it."""
    from jobs.launch import queue_run

    with open_store() as store:
        run = queue_run(store, config, name=name, parent_id=parent_id, tags=tags)
    print(f"run {run.id} ({run.uuid}) '{run.name}' queued: {run.total_steps} steps")
    print(dashboard_url(run.id))
    return 0


def cmd_submit(args: argparse.Namespace) -> int:
    return _queue(load_run_config(args.config, args.set), tags=args.tag)


def cmd_clone(args: argparse.Namespace) -> int:
    """A new run from another's configuration with --set changes, linked to it as parent.
    It gets its own output_dir (and name) unless --set gives one."""
    import uuid

    with open_store() as store:
        parent = store.get_run(args.run)
    base = RunConfig.from_flat(parent.config)
    suffix = uuid.uuid4().hex[:6]
    own = (
        []
        if overridden(args.set, "output_dir")
        else [f"output_dir={str(base.data.output_dir).rstrip('/')}-clone-{suffix}"]
    )
    config = base.with_overrides(own + args.set)
    name = (
        config.logging.run_name
        if overridden(args.set, "run_name")
        else f"{parent.name}-clone-{suffix}"
    )
    return _queue(config, name=name, parent_id=parent.id, tags=parent.tags)


def cmd_runs(args: argparse.Namespace) -> int:
    from jobs.phases import phase_of, status_text
    from jobs.scheduler import SchedulerSettings

    try:
        timeout = SchedulerSettings.from_env().heartbeat_timeout_seconds
    except ValueError as exc:  # a malformed ESLAB_HEARTBEAT_TIMEOUT_S
        print_error(str(exc))
        return 2
    with open_store() as store:
        runs = store.list_runs(limit=args.limit)
        now = store.database_now()  # the clock the heartbeats were written in
        statuses = [status_text(r, phase_of(store, r), timeout, now) for r in runs]
    if not runs:
        print("no runs yet; `eslab submit CONFIG.yaml` queues one")
        return 0
    rows = [("ID", "NAME", "METHOD", "STATUS", "STEP", "CREATED")]
    rows += [
        (
            str(r.id),
            r.name,
            r.method,
            status,
            f"{r.step}/{r.total_steps or '?'}",
            r.created_at.astimezone().strftime("%Y-%m-%d %H:%M"),
        )
        for r, status in zip(runs, statuses, strict=True)
    ]
    print_table(rows)
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    from jobs.store.status import RunStatus

    if (args.run is None) == (args.sweep is None):
        print_error("give a run to cancel, or --sweep ID")
        return 2
    if args.sweep is not None:
        return _cancel_sweep(args.sweep)
    with open_store() as store:
        run = store.request_cancel(args.run)
    if run.status is RunStatus.CANCELLED:
        print(f"run {run.id} cancelled (it had not started)")
    elif run.ray_submission_id is None:
        print(
            f"run {run.id} is cancelling: its `eslab train` process finishes the current "
            "step, saves a checkpoint and ends it cancelled; if that process is gone, "
            "`eslab serve` ends it cancelled once its heartbeat is ESLAB_HEARTBEAT_TIMEOUT_S "
            "old (`eslab resume` continues it)"
        )
    else:
        print(
            f"run {run.id} is cancelling: its job finishes the current step, saves a "
            "checkpoint and ends cancelled (`eslab resume` continues it)"
        )
    return 0


def _cancel_sweep(sweep: str) -> int:
    from jobs.sweeps.driver import cancel_sweep

    with open_store() as store:
        record = store.get_sweep(sweep)
        runs = cancel_sweep(store, record.id)
    stopped = ", ".join(f"{r.id} ({r.status.value})" for r in runs) or "none was queued or running"
    print(
        f"sweep {record.id} '{record.name}' cancelled: it queues no more runs; its runs: {stopped}"
    )
    return 0


def cmd_resume(args: argparse.Namespace) -> int:
    """Queue a failed or cancelled run again from its latest checkpoint, same run id;
    what the stopped attempt wrote after that checkpoint is replaced, not duplicated."""
    from jobs.worker import latest_checkpoint

    with open_store() as store:
        checkpoint = latest_checkpoint(store, args.run)
        run = store.resume_run(args.run, checkpoint.step if checkpoint else 0)
    where = (
        f"{checkpoint.path} (step {checkpoint.step})"
        if checkpoint
        else "the start (no checkpoint was saved)"
    )
    print(f"run {run.id} queued again as attempt {run.attempt}: resumes from {where}")
    print(dashboard_url(run.id))
    return 0
