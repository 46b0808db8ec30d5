"""Full-resolution downloads of a run and a sweep's table (what `eslab export` writes), built
only when the user clicks (deferred download data), never on a rerun, and their file names.

A checkpoint is offered as a tar only up to ESLAB_MAX_DOWNLOAD_MB (default 1024 MiB). The
installed Streamlit's download button cannot stream: whatever its callable returns (bytes or
an open file) is read whole into the server's memory and kept there for the session. So the
archive is written to an unnamed temporary file in the data folder (gone once closed, even
if the dashboard dies), handed over as that file, and a larger checkpoint is refused with
its path on the server instead of being loaded into memory."""

from __future__ import annotations

import io
import json
import os
import stat
import tarfile
import tempfile
from dataclasses import asdict
from pathlib import Path

import pandas as pd

from engine.data.uploads import MIB, positive_setting
from engine.filenames import safe_file_name
from engine.paths import data_dir, resolve_path
from jobs.store.records import RunRecord, SweepRecord
from jobs.store.store import Store
from jobs.sweeps.driver import sweep_table

MAX_DOWNLOAD_ENV = "ESLAB_MAX_DOWNLOAD_MB"
DEFAULT_MAX_DOWNLOAD_MB = 1024


class DownloadTooLarge(Exception):
    """A checkpoint folder is larger than ESLAB_MAX_DOWNLOAD_MB."""


def run_json(store: Store, run_id: int) -> str:
    """Everything the run recorded: the run, metrics, population, samples, checkpoints,
    events."""
    return json.dumps(asdict(store.export_run(run_id)), default=str, indent=1)


def metrics_csv(store: Store, run_id: int) -> str:
    """One row per (key, step) at full resolution."""
    return pd.DataFrame(store.export_run(run_id).metrics).to_csv(index=False)


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


def folder_size(folder: Path) -> int:
    """Bytes of the plain files under `folder`, links not followed (tar stores a link as a
    link, so what it points to is neither counted nor archived)."""
    total = 0
    for root, _dirs, files in os.walk(folder):
        for name in files:
            info = os.lstat(os.path.join(root, name))
            total += info.st_size if stat.S_ISREG(info.st_mode) else 0
    return total


def max_download_bytes() -> int:
    return int(positive_setting(MAX_DOWNLOAD_ENV, DEFAULT_MAX_DOWNLOAD_MB) * MIB)


def too_large(path: str) -> str | None:
    """Why checkpoint `path` is not offered as a download, or None when it is."""
    folder = resolve_path(path)
    size, limit = folder_size(folder), max_download_bytes()
    if size <= limit:
        return None
    return (
        f"This checkpoint is {size / MIB:.0f} MiB, more than the dashboard serves "
        f"({limit / MIB:.0f} MiB, the setting {MAX_DOWNLOAD_ENV}); copy {folder} from the "
        "server instead."
    )


def folder_tar(path: str) -> io.RawIOBase:
    """A checkpoint folder as an uncompressed tar (weights barely compress), in an unnamed
    temporary file of the data folder, read from its start; DownloadTooLarge above the
    limit (checked again here: the folder may have grown since the button was drawn)."""
    reason = too_large(path)
    if reason:
        raise DownloadTooLarge(reason)
    folder = resolve_path(path)
    scratch = data_dir() / "tmp"
    scratch.mkdir(parents=True, exist_ok=True)
    raw = tempfile.TemporaryFile(dir=scratch, buffering=0)  # noqa: SIM115 (the caller's)
    try:
        buffered = io.BufferedWriter(raw, buffer_size=MIB)
        with tarfile.open(fileobj=buffered, mode="w") as tar:
            tar.add(folder, arcname=folder.name)
        buffered.flush()
        buffered.detach()  # keeps `raw` open
        raw.seek(0)
    except BaseException:
        raw.close()
        raise
    return raw
