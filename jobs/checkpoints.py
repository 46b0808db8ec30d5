"""Which of a run's checkpoints a resume starts from."""

from __future__ import annotations

from pathlib import Path

from jobs.store.records import CheckpointRecord
from jobs.store.store import Store


def latest_checkpoint(store: Store, run_id: int | str) -> CheckpointRecord | None:
    """The newest checkpoint the database lists whose folder still exists (the trainer
    renames a finished checkpoint into place, so an existing folder is a complete one;
    save_total_limit removes old folders but not their rows)."""
    for checkpoint in reversed(store.checkpoints(run_id)):
        if Path(checkpoint.path).is_dir():
            return checkpoint
    return None
