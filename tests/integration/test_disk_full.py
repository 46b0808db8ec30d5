"""The disk fills while a checkpoint is written. A real filesystem of a fixed size (a tmpfs
mounted for the test, skipped where this user may not mount one) holds the run's output; once
the first checkpoint is written it is shrunk to leave half a checkpoint's room, so the second
save runs out of space in the kernel's own write path."""

from __future__ import annotations

import errno
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.sink import MemorySink
from engine.trainer import train
from engine.trainer.checkpoints import (
    STATE_FILE,
    CheckpointWriteError,
    disk_full,
    list_checkpoints,
)
from tests.integration.test_training import conciseness_config, untimed

MiB = 2**20


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "disk"
    mount.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4g", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def resize(mount: Path, size_bytes: int) -> None:
    subprocess.run(["mount", "-o", f"remount,size={size_bytes}", str(mount)], check=True)


def folder_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


class FillingSink(MemorySink):
    """Leaves half a checkpoint's room on the disk once the first checkpoint is written."""

    def __init__(self, mount: Path) -> None:
        super().__init__()
        self.mount = mount

    def log_checkpoint(self, step: int, path: str) -> None:
        super().log_checkpoint(step, path)
        if step == 1:
            used = shutil.disk_usage(self.mount).used
            resize(self.mount, used + folder_bytes(Path(path)) // 2)


@pytest.mark.heavy
def test_a_full_disk_fails_the_save_naming_it_and_a_resume_continues(pool, small_disk):
    options = {"max_steps": 2, "save_strategy": "steps", "save_steps": 1}
    config = conciseness_config(small_disk, population_size=2, max_tokens=8, **options)
    out = small_disk / "out"
    sink = FillingSink(small_disk)
    with pytest.raises(CheckpointWriteError) as failure:
        train(config, sink, pool=pool)
    message = str(failure.value)
    assert "checkpoint-2 could not be written: no space left on the disk of" in message
    assert "the earlier checkpoints are intact (checkpoint-1)" in message
    assert "eslab resume" in message
    # nothing half-written stays, the first checkpoint is whole, and step 2's metrics stand
    assert [p.name for p in out.iterdir() if p.name.startswith(".")] == []
    assert [p.name for p in list_checkpoints(out)] == ["checkpoint-1"]
    assert (out / "checkpoint-1" / STATE_FILE).is_file()
    assert [r.step for r in sink.steps] == [1, 2]

    resize(small_disk, 4 * 2**30)  # space freed
    resumed = MemorySink()
    train(config, resumed, pool=pool, resume_from=out / "checkpoint-1")
    assert [untimed(r.metrics) for r in resumed.steps] == [untimed(sink.steps[1].metrics)]
    assert [p.name for p in list_checkpoints(out)] == ["checkpoint-1", "checkpoint-2"]


def test_a_full_disk_is_known_through_the_errors_that_wrap_it():
    """An engine in a Ray actor raises its OSError inside Ray's own error."""
    wrapped = RuntimeError("the actor's task failed")
    wrapped.__cause__ = OSError(errno.ENOSPC, "No space left on device")
    assert disk_full(wrapped)
    assert disk_full(OSError(errno.EDQUOT, "Disk quota exceeded"))
    assert disk_full(RuntimeError("OSError: [Errno 28] No space left on device"))
    assert not disk_full(OSError(errno.EACCES, "Permission denied"))
    assert not disk_full(RuntimeError("engine lost"))
