"""What an `eslab serve` that was killed outright (SIGKILL, the OOM killer) leaves behind, and
how the next one on the same database deals with it.

Such a serve runs no cleanup: its local Ray head (in a session of its own, so that a Ctrl-C
in the terminal reaches ES Lab first) keeps running with the runs' jobs, its Streamlit keeps
the dashboard's port, and its scheduler lock stays taken until the lease ends. So a serve
writes down, in the private folder and per database, its own process, its dashboard's and its
head's; the next serve on that database reads the note and:

- adopts the head when it is still up and answers (with this user's token): the runs that
  were training go on, and the new scheduler follows their jobs as it follows a RAY_ADDRESS
  cluster's; a head that no longer answers is stopped, with every process of it, and the
  runs it held fail naming the stopped service (`eslab resume` continues them);
- stops the dead serve's dashboard, which holds the port;
- takes over the scheduler lock when its holder is a process of this machine that is gone,
  instead of waiting out the lease (jobs.scheduler.owner_is_gone).

Processes are recognised by what they run (the head's private temp dir, the dashboard's app
file) as well as by pid, so a pid the system has given to another process is left alone.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import signal
from dataclasses import asdict, dataclass, replace

import psutil

from jobs.private_files import read_private, remove_private, write_private

STOP_WAIT_S = 30.0


@dataclass(frozen=True)
class Head:
    """A local Ray head: its `ray start --block` process, private temp dir and dashboard."""

    pid: int
    temp_dir: str
    address: str


@dataclass(frozen=True)
class ServeNote:
    """What one serve runs; `head` None while it has none of its own (RAY_ADDRESS)."""

    serve_pid: int
    dashboard_pid: int | None = None
    head: Head | None = None


def note_name(database: str) -> str:
    """The note's file name for `database` (its URL without the password): one scheduler,
    so one serve with a head, per database."""
    return "serve-" + hashlib.sha256(database.encode()).hexdigest()[:16]


def read_note(database: str) -> ServeNote | None:
    """The note of the last serve on `database`; None when there is none or it is unreadable."""
    try:
        raw = json.loads(read_private(note_name(database)) or "null")
        if raw is None:
            return None
        head = Head(**raw["head"]) if raw.get("head") else None
        return ServeNote(int(raw["serve_pid"]), raw.get("dashboard_pid"), head)
    except (ValueError, TypeError, KeyError):
        return None


def write_note(database: str, note: ServeNote) -> None:
    write_private(note_name(database), json.dumps(asdict(note)))


def forget_note(database: str) -> None:
    remove_private(note_name(database))


def _process(pid: int | None, marker: str) -> psutil.Process | None:
    """The live process `pid` when its command line mentions `marker`, else None."""
    if pid is None:
        return None
    try:
        process = psutil.Process(pid)
        return process if marker in " ".join(process.cmdline()) else None
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None


def serve_alive(note: ServeNote) -> bool:
    """Whether the serve that wrote `note` still runs (then nothing of it is a leftover):
    `eslab serve` or `python -m app.cli serve`."""
    return _process(note.serve_pid, " serve") is not None


def head_process(head: Head) -> psutil.Process | None:
    return _process(head.pid, f"--temp-dir={head.temp_dir}")


def stop_dashboard(note: ServeNote, app_file: str) -> bool:
    """Stop the dead serve's Streamlit, which still holds the dashboard's port; whether one
    was running."""
    process = _process(note.dashboard_pid, app_file)
    if process is None:
        return False
    _stop([process])
    return True


def stop_head(head: Head) -> int:
    """Stop a head and every process that runs in its temp dir (GCS, raylet, dashboard,
    agents, workers), then remove the dir; returns how many processes there were. SIGTERM
    first: `ray start --block` then stops its processes itself; whatever is left after
    STOP_WAIT_S is killed."""
    processes = head_processes(head.temp_dir)
    if (main := head_process(head)) is not None and main not in processes:
        processes.append(main)
    _stop(processes)
    shutil.rmtree(head.temp_dir, ignore_errors=True)
    return len(processes)


def head_processes(temp_dir: str) -> list[psutil.Process]:
    """Every live process that runs in a head's temp dir: what of the head is left."""
    return [p for p in psutil.process_iter(["cmdline"]) if _runs_in(p, temp_dir)]


def _runs_in(process: psutil.Process, temp_dir: str) -> bool:
    cmdline = process.info.get("cmdline") or []
    return any(temp_dir in part for part in cmdline)


def _stop(processes: list[psutil.Process]) -> None:
    for process in processes:
        try:
            process.send_signal(signal.SIGTERM)
        except psutil.NoSuchProcess:
            continue
    _, alive = psutil.wait_procs(processes, timeout=STOP_WAIT_S)
    for process in alive:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            continue
    psutil.wait_procs(alive, timeout=STOP_WAIT_S)


class NoteKeeper:
    """Keeps this serve's note up to date as its dashboard and head start, for a successor
    if this serve is killed; `forget` at a clean stop."""

    def __init__(self, database: str, serve_pid: int) -> None:
        self.database = database
        self.note = ServeNote(serve_pid)

    def record(self, **changes: object) -> None:
        self.note = replace(self.note, **changes)
        write_note(self.database, self.note)

    def forget(self) -> None:
        forget_note(self.database)
