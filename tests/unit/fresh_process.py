"""Triton kernels checked on a CPU run in Triton's interpreter, which must be on before Triton
is first imported (and vLLM imports it in the test process): such checks run in a fresh
Python process and print their outcome as JSON on their last line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def checked_in_fresh_process(args: list[str], interpret: bool) -> Any:
    """The JSON that `python args...` prints last, run from the repository's root, with
    Triton's interpreter on when `interpret`; a failing process fails the test with its
    error."""
    path = os.environ.get("PYTHONPATH")
    env = {**os.environ, "PYTHONPATH": str(ROOT) + (os.pathsep + path if path else "")}
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    done = subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
