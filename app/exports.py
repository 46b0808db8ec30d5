"""Full-resolution downloads of a run and a sweep's table (what `eslab export` writes), built
only when the user clicks (deferred download data), never on a rerun, and their file names;
a checkpoint as a tar streamed to a file or stdout, for `eslab export --checkpoint`.

Streamlit holds whatever a download button serves whole in the server's memory (a callable's
file too is read into bytes, once per click). So the dashboard builds a run's JSON only up to
MAX_RUN_JSON_MB (checked in the database before anything is loaded), its metrics CSV from the
metrics alone, and never a checkpoint: the Run page names the `eslab export` command that
streams one from the server instead."""

from __future__ import annotations

import json
import tarfile
from dataclasses import asdict
from typing import BinaryIO

import pandas as pd

from engine.data.uploads import MIB
from engine.filenames import safe_file_name
from engine.paths import resolve_path
from jobs.store.records import RunRecord, SweepRecord
from jobs.store.store import Store
from jobs.sweeps.driver import sweep_table

MAX_RUN_JSON_MB = 32


def run_json_refusal(store: Store, run_id: int) -> str | None:
    """Why the dashboard does not build run `run_id`'s JSON, or None when it does."""
    size = store.export_size(run_id)
    if size <= MAX_RUN_JSON_MB * MIB:
        return None
    return (
        f"This run's JSON would be about {size / MIB:.0f} MiB, more than the dashboard builds "
        f"({MAX_RUN_JSON_MB} MiB); on the server, `eslab export {run_id} --out FILE.json` "
        "writes it."
    )


def run_json(store: Store, run_id: int) -> str:
    """Everything the run recorded: the run, metrics, population, samples, checkpoints,
    events."""
    return json.dumps(asdict(store.export_run(run_id)), default=str, indent=1)


def metrics_csv(store: Store, run_id: int) -> str:
    """One row per (key, step) at full resolution."""
    return pd.DataFrame(store.metric_rows(run_id)).to_csv(index=False)


def sweep_csv(store: Store, sweep_id: int) -> str:
    """One row per run of the sweep (jobs.sweeps.driver.sweep_table)."""
    return sweep_table(store, sweep_id).to_csv(index=False)


def sweep_json(store: Store, sweep_id: int) -> str:
    """The sweep (its search and base configuration) and its runs, one row each."""
    sweep = store.get_sweep(sweep_id)
    table = sweep_table(store, sweep.id)
    rows = table.astype(object).where(table.notna(), None).to_dict(orient="records")
    record = {k: v.isoformat() if hasattr(v, "isoformat") else v for k, v in asdict(sweep).items()}
    return json.dumps({"sweep": record, "runs": rows}, indent=1, default=str) + "\n"


def sweep_file_name(sweep: SweepRecord, suffix: str) -> str:
    """`sweep-ID-NAME SUFFIX` in safe characters, as a run's downloads are named."""
    return safe_file_name(f"sweep-{sweep.id}-{sweep.name}", suffix)


def file_name(run: RunRecord, suffix: str, part: str = "") -> str:
    """A download's name: `run-ID-NAME[-PART]SUFFIX` in safe characters (the run's name is
    whatever its author typed)."""
    return safe_file_name(f"run-{run.id}-{run.name}{'-' + part if part else ''}", suffix)


def checkpoint_command(run: RunRecord, step: int) -> str:
    """The command that writes checkpoint `step` of `run` as a tar, on the server."""
    return (
        f"eslab export {run.id} --checkpoint {step} --out {file_name(run, '.tar', f'step-{step}')}"
    )


def write_checkpoint_tar(path: str, out: BinaryIO) -> None:
    """Checkpoint folder `path` as an uncompressed tar (weights barely compress) written to
    `out` as a stream, file by file, so that no more than tar's buffer is held at once.
    Links stay links: what they point to is neither read nor archived."""
    folder = resolve_path(path)
    with tarfile.open(fileobj=out, mode="w|") as tar:
        tar.add(folder, arcname=folder.name)
