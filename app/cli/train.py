"""`eslab train`: one run in the foreground (no Ray, no scheduler) with a progress bar,
recorded in the database unless --no-db names a JSON lines file instead."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from app.cli.common import add_set_option, load_run_config
from engine.sink import Sink


def add_commands(commands: argparse._SubParsersAction) -> None:
    train = commands.add_parser(
        "train", help="train in the foreground (no Ray) with a progress bar, recorded in the db"
    )
    train.add_argument(
        "config",
        help="YAML file of option: value pairs, or a preset name (`eslab presets` lists them)",
    )
    add_set_option(train, "override an option of the file (repeatable)")
    train.add_argument("--resume", metavar="CHECKPOINT", help="continue from checkpoint-STEP/")
    train.add_argument(
        "--no-db",
        metavar="METRICS.jsonl",
        help="write JSON lines to this file instead of the database",
    )
    train.set_defaults(func=cmd_train)


def cmd_train(args: argparse.Namespace) -> int:
    """Train in the foreground (no Ray, no scheduler) with a progress bar."""
    from engine.progress import ProgressSink
    from engine.sink import JsonlSink
    from engine.trainer import plan_total_steps, train

    config = load_run_config(args.config, args.set)
    if args.no_db:
        total = plan_total_steps(config)
        log = Path(args.no_db)
        progress = ProgressSink(JsonlSink(log), total)
        try:
            output = train(config, progress, resume_from=args.resume)
        finally:
            progress.close()
        print(f"final model in {output}; metrics in {log}")
        return 0

    from jobs.runner import create_foreground_run
    from jobs.store.status import RunStatus
    from jobs.store.store import Store
    from jobs.worker import Worker

    store = Store()
    run = create_foreground_run(store, config)
    print(f"run {run.id} ({run.uuid}) '{run.name}': {run.total_steps} steps", flush=True)
    bars: list[ProgressSink] = []

    def with_progress(sink: Sink) -> Sink:
        bars.append(ProgressSink(sink, run.total_steps or 0, run.name))
        return bars[0]

    try:
        Worker(
            store, run.id, foreground=True, resume_from=args.resume, wrap_sink=with_progress
        ).run()
    finally:
        for bar in bars:
            bar.close()
    ended = store.get_run(run.id)
    if ended.attempt != run.attempt:
        print(
            f"eslab: run {run.id} was resumed as attempt {ended.attempt} while this process "
            f"ran attempt {run.attempt}; this process stopped and recorded nothing",
            file=sys.stderr,
        )
        return 1
    events = store.events(run.id)
    last_event = events[-1].message if events else ""
    if ended.status is RunStatus.SUCCEEDED:
        print(f"run {run.id} {last_event}")
        return 0
    print(f"eslab: run {run.id} {ended.status.value}: {last_event}", file=sys.stderr)
    return 1 if ended.status is RunStatus.FAILED else 130
