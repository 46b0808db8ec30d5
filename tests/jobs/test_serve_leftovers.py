"""What a serve killed outright leaves, as the next serve finds it (jobs.serve_leftovers):
its note per database, a head that no longer answers stopped with every process in its temp
dir (one that ignores SIGTERM included), and a lock whose holder is gone from this machine.
Real processes stand in for Ray's; tests/jobs/test_service.py kills a real serve."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from jobs import serve_leftovers
from jobs.ray_head import _adopt
from jobs.scheduler import owner_is_gone
from jobs.serve_leftovers import Head, ServeNote, forget_note, read_note, stop_head, write_note

IGNORE_TERM = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"


def ray_like(temp_dir: Path, script: str = "import time; time.sleep(600)") -> subprocess.Popen:
    """A process whose command line names `temp_dir` as Ray's processes do."""
    return subprocess.Popen([sys.executable, "-c", script, f"--temp-dir={temp_dir}"])


@pytest.fixture
def quick_stop(monkeypatch):
    monkeypatch.setattr(serve_leftovers, "STOP_WAIT_S", 2.0)


def test_a_note_is_kept_per_database(tmp_path, monkeypatch):
    monkeypatch.setenv("ESLAB_DATA_DIR", str(tmp_path))
    note = ServeNote(123, 456, Head(789, "/tmp/eslab-ray-x", "http://127.0.0.1:8265"))
    write_note("sqlite:///a.db", note)
    assert read_note("sqlite:///a.db") == note
    assert read_note("sqlite:///b.db") is None
    forget_note("sqlite:///a.db")
    assert read_note("sqlite:///a.db") is None


def test_a_head_that_does_not_answer_is_stopped_with_all_its_processes(
    tmp_path, quick_stop, capsys
):
    temp_dir = tmp_path / "eslab-ray-1"
    temp_dir.mkdir()
    main = ray_like(temp_dir)
    stubborn = ray_like(temp_dir, IGNORE_TERM)
    other = ray_like(tmp_path / "another-head")
    try:
        head = Head(main.pid, str(temp_dir), "http://127.0.0.1:9")  # nothing listens there
        assert not _adopt(head, token_auth=False)
        assert main.wait(10) is not None and stubborn.wait(10) is not None
        assert other.poll() is None  # another head's process is left alone
        assert not temp_dir.exists()
        assert "stopped 2 process(es) left of the Ray head" in capsys.readouterr().out
        assert stop_head(head) == 0  # nothing left
    finally:
        for process in (main, stubborn, other):
            process.kill()
            process.wait()


def test_a_lock_is_taken_over_only_from_a_gone_process_of_this_machine():
    here = socket.gethostname()
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert owner_is_gone(f"{here}:{gone.pid}:abc123")
    assert not owner_is_gone(f"{here}:{os.getpid()}:abc123")
    assert not owner_is_gone(f"another-host:{gone.pid}:abc123")  # not ours to judge
    assert not owner_is_gone("a lock of some other tool")
