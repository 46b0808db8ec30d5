"""Running a module of Triton kernel checks (functions named check_*) on a GPU or, without
one, in Triton's interpreter on the CPU: the interpreter must be switched on before Triton is
first imported, and vLLM imports it in the test process, so the checks run in a fresh process
there and report their outcomes as JSON (tests/unit/test_cuda_weights.py,
test_cuda_lora_kernels.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def check_names(namespace: Mapping[str, object]) -> list[str]:
    return sorted(name for name in namespace if name.startswith("check_"))


def report(namespace: Mapping[str, object]) -> None:
    """Run every check of `namespace`; print {name: None, or the failure's traceback}."""
    outcomes: dict[str, str | None] = {}
    for name in check_names(namespace):
        check = namespace[name]
        assert callable(check)
        try:
            check()
            outcomes[name] = None
        except Exception:  # each check's failure is reported, not raised
            outcomes[name] = traceback.format_exc()
    print(json.dumps(outcomes))


def interpreted(module: str) -> dict[str, str | None]:
    """The outcomes of `python -m module` (which calls report) with the interpreter on."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", module],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def run(name: str, check: Callable[[], None], outcomes: dict[str, str | None] | None) -> None:
    """Check `name`: here (outcomes None: on a GPU), else its interpreted outcome."""
    if outcomes is None:
        check()
    else:
        assert outcomes[name] is None, outcomes[name]
