"""The one-launch weight kernels of CUDA engines (tests/unit/cuda_weight_checks.py): compiled
and bit for bit against the torch path on a GPU (bench/gpu/run_tests.sh runs this file there);
elsewhere in Triton's interpreter, in a fresh process because the interpreter must be on
before Triton is first imported (vLLM imports it in this one)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from tests.unit import cuda_weight_checks as checks  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CHECKS = sorted(name for name in vars(checks) if name.startswith("check_"))


@pytest.fixture(scope="module")
def interpreted() -> dict[str, str | None] | None:
    """Every check's outcome in a process with Triton's interpreter on; None on a GPU."""
    if checks.ON_GPU:
        return None
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "tests.unit.cuda_weight_checks"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", CHECKS)
def test_weight_kernel(name: str, interpreted: dict[str, str | None] | None) -> None:
    if interpreted is None:
        getattr(checks, name)()
    else:
        assert interpreted[name] is None, interpreted[name]
