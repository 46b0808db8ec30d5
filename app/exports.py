"""Full-resolution downloads of a run and a sweep's table (what `eslab export` writes), built
only when the user clicks (deferred download data), never on a rerun, and their file names;
a checkpoint as a tar, produced chunk by chunk, for `eslab export --checkpoint` (to a file or
stdout) and for the dashboard's download route (app/checkpoint_route.py).

Streamlit holds whatever a download button serves whole in the server's memory (a callable's
file too is read into bytes, once per click). So the dashboard builds a run's JSON only up to
MAX_RUN_JSON_MB (checked in the database before anything is loaded), its metrics CSV from the
metrics alone, and never a checkpoint through a button: the Run page links to the route,
which streams the tar, and names the `eslab export` command that writes it on the server."""

from __future__ import annotations

import io
import json
import os
import stat
import tarfile
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import BinaryIO

import pandas as pd

from engine.data.uploads import MIB
from engine.filenames import safe_file_name
from engine.paths import resolve_path
from jobs.store.records import RunRecord, SweepRecord
from jobs.store.store import Store
from jobs.sweeps.driver import sweep_table

MAX_RUN_JSON_MB = 32
TAR_CHUNK_BYTES = MIB
"""How much of a checkpoint's file one chunk of its tar holds: all a download holds at once."""


class NoCheckpoint(LookupError):
    """The run has no checkpoint of that step on this machine; the message says which it has."""


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


def checkpoint_file_name(run: RunRecord, step: int) -> str:
    """The name of the tar of checkpoint `step` of `run`, downloaded or written."""
    return file_name(run, ".tar", f"step-{step}")


def checkpoint_command(run: RunRecord, step: int) -> str:
    """The command that writes checkpoint `step` of `run` as a tar, on the server."""
    return f"eslab export {run.id} --checkpoint {step} --out {checkpoint_file_name(run, step)}"


def checkpoint_folder(store: Store, run: RunRecord, step: int) -> Path:
    """The folder of `run`'s checkpoint of `step`, as the store recorded it (never a path
    someone typed); NoCheckpoint when the run recorded none of that step or it is gone."""
    recorded = store.checkpoints(run.id)
    found = [c.path for c in recorded if c.step == step]
    if not found:
        steps = ", ".join(str(c.step) for c in recorded) or "none yet"
        raise NoCheckpoint(
            f"run {run.id} has no checkpoint of step {step} (its checkpoints: {steps})"
        )
    folder = resolve_path(found[0])
    if not folder.is_dir():
        raise NoCheckpoint(
            f"the checkpoint of step {step} of run {run.id} is not on this machine ({folder})"
        )
    return folder


def write_checkpoint_tar(folder: Path, out: BinaryIO) -> None:
    """checkpoint_tar_chunks(folder) written to `out`."""
    for chunk in checkpoint_tar_chunks(folder):
        out.write(chunk)


def checkpoint_tar_chunks(folder: Path) -> Iterator[bytes]:
    """Checkpoint `folder` as an uncompressed tar (weights barely compress), the folder under
    its own name, as the chunks of a stream: each member's header, then its file at most
    TAR_CHUNK_BYTES at a time, so that a checkpoint of any size costs one chunk of memory.
    tarfile makes the headers (long names, hard links) and the index of hard links; the
    walk is tar's: a folder's entries sorted by name, links stay links (what they point to
    is neither read nor archived), sockets and the like are left out."""
    written = 0
    with tarfile.open(fileobj=io.BytesIO(), mode="w") as index:  # headers only: nothing kept
        for source, arcname in _tar_entries(folder, folder.name):
            info = index.gettarinfo(str(source), arcname)
            if info is None:
                continue
            header = info.tobuf(index.format, index.encoding, index.errors)
            yield header
            written += len(header)
            if info.isreg():
                yield from _file_chunks(source, info.size)
                padding = -info.size % tarfile.BLOCKSIZE
                yield tarfile.NUL * padding
                written += info.size + padding
    end = 2 * tarfile.BLOCKSIZE
    yield tarfile.NUL * (end + (-(written + end) % tarfile.RECORDSIZE))


def _tar_entries(path: Path, arcname: str) -> Iterator[tuple[Path, str]]:
    yield path, arcname
    if path.is_dir() and not path.is_symlink():
        for name in sorted(os.listdir(path)):
            yield from _tar_entries(path / name, f"{arcname}/{name}")


def _file_chunks(path: Path, size: int) -> Iterator[bytes]:
    """The first `size` bytes of regular file `path`, a chunk at a time; opened without
    following a link, so a file swapped for a link after its header was made is not read."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with open(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise OSError(f"{path} is no longer a regular file")
        left = size
        while left:
            chunk = f.read(min(left, TAR_CHUNK_BYTES))
            if not chunk:
                raise OSError(f"{path} shrank while it was being archived")
            left -= len(chunk)
            yield chunk
