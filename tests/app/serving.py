"""`eslab serve` as a user starts it, for the end-to-end tests: Ray head, scheduler and
dashboard on a temporary database, in a session of its own, stopped with Ctrl-C (SIGINT to
its group) so that it stops its Ray head."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from engine.paths import PROJECT_ROOT
from tests.app.browser import free_port

ESLAB = str(Path(sys.executable).with_name("eslab"))
START_DEADLINE_S = 180


def serve_env(db_url: str, **settings: str) -> dict[str, str]:
    """The environment of a serve on `db_url` that ticks fast, and of the commands that talk
    to it; this checkout's code (PYTHONPATH), never a RAY_ADDRESS of the machine's."""
    env = {
        **os.environ,
        "ESLAB_DATABASE_URL": db_url,
        "PYTHONPATH": str(PROJECT_ROOT),
        "ESLAB_SCHEDULER_TICK_S": "0.5",
        "ESLAB_HEARTBEAT_S": "1",
        "ESLAB_STOP_WAIT_S": "20",
        **settings,
    }
    env.pop("RAY_ADDRESS", None)
    return env


@contextmanager
def eslab_serve(env: Mapping[str, str], log_path: Path, port: int | None = None) -> Iterator[str]:
    """The dashboard URL of an `eslab serve` with `env` on `port` (a free one by default), its
    output in `log_path`. Raises RuntimeError when it does not come up (bench/soak.py uses it
    outside pytest too)."""
    port = port or free_port()
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [ESLAB, "serve", "--port", str(port)],
            env=dict(env),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + START_DEADLINE_S
            while not answers(f"{base}/_stcore/health"):
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("eslab serve did not start: " + log_path.read_text())
                time.sleep(0.5)
            yield base
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGINT)
                try:
                    process.wait(120)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait()


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status == 200
    except OSError:
        return False
