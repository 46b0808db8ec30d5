"""Datasets uploaded through the dashboard: where they are kept, how large one may be, how
one is kept, and which are old enough to be removed once no run uses them.

An upload is written under a hidden temporary name in the uploads folder, read back with
`load_dataset` (the check every run makes) and only then renamed to its final name; any
failure removes it, so the folder only ever holds datasets that load. A file widget of the
dashboard takes at most FORM_UPLOAD_MB (Streamlit holds it in memory); a larger dataset
comes through the dashboard's upload route (app/upload_route.py), written here chunk by chunk
by UploadWriter as it arrives. The limits are settings because the operator decides what a
shared dashboard accepts:

- ESLAB_MAX_UPLOAD_MB (default 100): the largest upload, in MiB; a parquet file's columns may
  decompress to at most DECOMPRESSED_RATIO times that (parquet compresses, so a small file
  could otherwise fill the dashboard's memory when it is read).
- ESLAB_UPLOAD_KEEP_HOURS (default 24): an upload no run refers to is removed once it is
  this old; it bounds the time between uploading a dataset and queueing its run.
"""

from __future__ import annotations

import math
import os
import time
import uuid
from pathlib import Path
from typing import NamedTuple

import pyarrow as pa
import pyarrow.parquet as pq

from engine import paths
from engine.data.datasets import DatasetError, load_dataset
from engine.filenames import safe_file_name

MAX_UPLOAD_ENV = "ESLAB_MAX_UPLOAD_MB"
KEEP_HOURS_ENV = "ESLAB_UPLOAD_KEEP_HOURS"
DEFAULT_MAX_UPLOAD_MB = 100
FORM_UPLOAD_MB = 1
"""What the dashboard's own file widgets take: Streamlit holds each file in memory."""
DEFAULT_KEEP_HOURS = 24.0
DECOMPRESSED_RATIO = 10
MIB = 2**20
PARTIAL_SUFFIX = ".partial"


class KeptUpload(NamedTuple):
    path: Path
    rows: int


def positive_setting(var: str, default: float) -> float:
    """The positive number in environment variable `var`, or `default` when it is unset;
    ValueError naming the variable otherwise (a typo must not lift a limit)."""
    raw = os.environ.get(var, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{var} must be a positive number, got {raw!r}")
    return value


def max_upload_mb() -> int:
    """ESLAB_MAX_UPLOAD_MB as whole MiB."""
    return max(1, int(positive_setting(MAX_UPLOAD_ENV, DEFAULT_MAX_UPLOAD_MB)))


def uploads_dir() -> Path:
    return paths.data_dir().absolute() / paths.UPLOADS_FOLDER


def keep_upload(data: bytes, name: str) -> KeptUpload:
    """Keep the uploaded parquet `data` (the browser called it `name`) in the uploads folder
    if it is a dataset a run can use; DatasetError naming `name` and what is wrong (and the
    setting for a size) otherwise, with nothing left behind."""
    with UploadWriter(name) as upload:
        upload.write(data)
        return upload.keep()


class UploadWriter:
    """One upload on its way into the uploads folder, written chunk by chunk, so that a
    dataset of any size arriving over the network is never held in memory: `write` each
    chunk (DatasetError once the total passes ESLAB_MAX_UPLOAD_MB, before it is written),
    then `keep` it. Used as a context manager, whatever was not kept is removed on exit."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.limit = max_upload_mb()  # a malformed setting refuses before a byte is written
        self.size = 0
        folder = uploads_dir()
        folder.mkdir(parents=True, exist_ok=True)
        token = uuid.uuid4().hex[:8]
        self.partial = folder / f".{token}{PARTIAL_SUFFIX}"
        self.final = folder / f"{token}-{safe_file_name(Path(name).stem, '.parquet', 'dataset')}"
        self._file = open(self.partial, "xb")  # noqa: SIM115 - closed by keep or __exit__

    def __enter__(self) -> UploadWriter:
        return self

    def __exit__(self, *_exc: object) -> None:
        self._file.close()
        self.partial.unlink(missing_ok=True)

    def write(self, chunk: bytes) -> None:
        self.size += len(chunk)
        if self.size > self.limit * MIB:
            raise DatasetError(too_large(self.name, self.size, self.limit))
        self._file.write(chunk)

    def keep(self) -> KeptUpload:
        """Check what was written as every run checks a dataset, then rename it into place."""
        self._file.close()
        _check_decompressed_size(self.partial, self.name, self.limit)
        try:
            rows = len(load_dataset(self.partial))
        except DatasetError as exc:  # name the upload, not the temporary file
            raise DatasetError(str(exc).replace(str(self.partial), self.name)) from None
        os.replace(self.partial, self.final)
        return KeptUpload(self.final, rows)


def too_large(name: str, size: int, limit_mb: int) -> str:
    """Why an upload of `size` bytes (or more) is refused, with the setting to change."""
    return (
        f"{name}: {size / MIB:.1f} MiB is more than uploads may be "
        f"({limit_mb} MiB, the setting {MAX_UPLOAD_ENV})"
    )


def _check_decompressed_size(path: Path, name: str, limit_mb: int) -> None:
    try:
        metadata = pq.ParquetFile(path).metadata
    except (pa.ArrowException, OSError) as exc:
        raise DatasetError(f"{name}: not a readable parquet file ({exc})") from None
    size = sum(metadata.row_group(i).total_byte_size for i in range(metadata.num_row_groups))
    if size > DECOMPRESSED_RATIO * limit_mb * MIB:
        raise DatasetError(
            f"{name}: its data decompresses to {size / MIB:.0f} MiB, more than "
            f"{DECOMPRESSED_RATIO} x {limit_mb} MiB (the setting {MAX_UPLOAD_ENV})"
        )


def stale_uploads(now: float | None = None) -> list[Path]:
    """Files of the uploads folder older than ESLAB_UPLOAD_KEEP_HOURS (links and folders are
    never listed: an upload is always a plain file), whether or not a run uses them; the
    caller keeps those a run refers to."""
    folder = uploads_dir()
    if not folder.is_dir():
        return []
    hours = positive_setting(KEEP_HOURS_ENV, DEFAULT_KEEP_HOURS)
    cutoff = (time.time() if now is None else now) - hours * 3600
    stale = []
    for entry in os.scandir(folder):
        if entry.is_file(follow_symlinks=False) and entry.stat().st_mtime < cutoff:
            stale.append(Path(entry.path))
    return sorted(stale)
