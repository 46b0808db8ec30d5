"""Running a training run and keeping its row in the database true: running while it runs,
then succeeded, or failed with the error. `eslab train` runs it in the foreground; the Ray
worker of the jobs issue reuses it."""

from __future__ import annotations

import traceback
import uuid
from collections.abc import Callable
from pathlib import Path

from engine.config import RunConfig
from engine.sink import Sink
from engine.trainer import plan_total_steps, train
from jobs.sink import DatabaseSink
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


def execute(store: Store, run: RunRecord, config: RunConfig,
            wrap_sink: Callable[[Sink], Sink] = lambda s: s,
            resume_from: str | Path | None = None) -> Path:
    """Train and record the outcome; an error marks the run failed and is raised again."""
    sink = wrap_sink(DatabaseSink(store, run.id))
    try:
        output = train(config, sink, resume_from=resume_from)
    except BaseException as exc:
        detail = "".join(traceback.format_exception(exc))
        status = RunStatus.CANCELLED if isinstance(exc, KeyboardInterrupt) else RunStatus.FAILED
        store.add_event(run.id, "error", f"{type(exc).__name__}: {exc}")
        store.set_status(run.id, status, error=detail)
        raise
    store.set_status(run.id, RunStatus.SUCCEEDED)
    return output
