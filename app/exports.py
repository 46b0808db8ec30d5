"""Full-resolution downloads of a run (what `eslab export` writes), built only when the
user clicks (deferred download data), never on a rerun."""

from __future__ import annotations

import json
from dataclasses import asdict

import pandas as pd

from jobs.store.store import Store


def run_json(store: Store, run_id: int) -> str:
    """Everything the run recorded: the run, metrics, population, samples, checkpoints,
    events."""
    return json.dumps(asdict(store.export_run(run_id)), default=str, indent=1)


def metrics_csv(store: Store, run_id: int) -> str:
    """One row per (key, step) at full resolution."""
    return pd.DataFrame(store.export_run(run_id).metrics).to_csv(index=False)


def folder_tar(path: str) -> bytes:
    """A checkpoint folder as an uncompressed tar (weights barely compress)."""
    import io
    import tarfile

    from engine.paths import resolve_path

    folder = resolve_path(path)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        tar.add(folder, arcname=folder.name)
    return buffer.getvalue()
