"""Files in the data folder's private folder, which only this user may enter: a database
URL with its password for the Ray jobs (jobs.scheduler), and the address of the dashboard
that `eslab serve` runs (jobs.service), which `eslab submit` prints. Written so that a link
or a file another user prepared never receives the text, and read only from a folder and a
file of this user, so that no one else can make `eslab` print their address."""

from __future__ import annotations

import os
import stat
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from engine.paths import PRIVATE_FOLDER, data_dir
from jobs.ray_jobs import SubmitError


def read_private(name: str) -> str | None:
    """The text of `name` in the private folder; None when it is missing, or when the folder
    or the file is not this user's alone (a link, another owner, open to others)."""
    folder = data_dir() / PRIVATE_FOLDER
    if not folder.is_dir():
        return None
    try:
        with private_folder(folder) as folder_fd:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=folder_fd)
            with os.fdopen(fd) as file:
                info = os.fstat(file.fileno())
                if info.st_uid != os.geteuid() or stat.S_IMODE(info.st_mode) & 0o077:
                    return None
                return file.read()
    except (OSError, SubmitError):
        return None


def remove_private(name: str) -> None:
    """Remove `name` from the private folder, if it is there."""
    with private_folder(data_dir() / PRIVATE_FOLDER) as folder_fd, suppress(FileNotFoundError):
        os.unlink(name, dir_fd=folder_fd)


def write_private(name: str, text: str) -> Path:
    """`name` in the private folder, readable by this user alone. Written under a fresh name
    that no one can have prepared (O_EXCL, O_NOFOLLOW) and renamed over the old file, so a
    link or a file that another user placed there never receives the text."""
    folder = data_dir() / PRIVATE_FOLDER
    with private_folder(folder) as folder_fd:
        temp = f".{name}.{uuid.uuid4().hex}"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
        fd = os.open(temp, flags, 0o600, dir_fd=folder_fd)
        try:
            with os.fdopen(fd, "w") as file:
                file.write(text)
            os.replace(temp, name, src_dir_fd=folder_fd, dst_dir_fd=folder_fd)
        except BaseException:
            os.unlink(temp, dir_fd=folder_fd)
            raise
    return folder / name


@contextmanager
def private_folder(folder: Path) -> Iterator[int]:
    """The folder's descriptor, after checking that it is a folder (not a link) of this user
    that no one else may enter; created 0700 when missing. Everything inside is then reached
    through the descriptor, so the folder cannot be swapped for another after the check."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    with suppress(FileExistsError):
        folder.mkdir(mode=0o700)
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as exc:  # a link (ELOOP) or a file (ENOTDIR)
        raise SubmitError(f"{folder} must be a folder, not a link or a file ({exc})") from exc
    try:
        info = os.fstat(fd)
        if info.st_uid != os.geteuid():
            raise SubmitError(
                f"{folder} belongs to user id {info.st_uid}, not to this user "
                f"({os.geteuid()}): it holds database passwords; remove it (ES Lab creates "
                "its own)"
            )
        if stat.S_IMODE(info.st_mode) & 0o077:
            raise SubmitError(
                f"{folder} is open to other users (mode {stat.S_IMODE(info.st_mode):o}): it "
                f"holds database passwords; `chmod 700 {folder}` or remove it"
            )
        yield fd
    finally:
        os.close(fd)
