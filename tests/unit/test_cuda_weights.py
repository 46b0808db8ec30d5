"""The one-launch weight kernels of CUDA engines (tests/unit/cuda_weight_checks.py): compiled
and bit for bit against the torch path on a GPU (bench/gpu/run_tests.sh runs this file there);
elsewhere in Triton's interpreter, in a fresh process because the interpreter must be on
before Triton is first imported (vLLM imports it in this one)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from tests.unit import cuda_weight_checks as checks  # noqa: E402
from tests.unit.fresh_process import checked_in_fresh_process  # noqa: E402

CHECKS = sorted(name for name in vars(checks) if name.startswith("check_"))


@pytest.fixture(scope="module")
def interpreted() -> dict[str, str | None] | None:
    """Every check's outcome in a process with Triton's interpreter on; None on a GPU."""
    if checks.ON_GPU:
        return None
    return checked_in_fresh_process(["-m", "tests.unit.cuda_weight_checks"], interpret=True)


@pytest.mark.parametrize("name", CHECKS)
def test_weight_kernel(name: str, interpreted: dict[str, str | None] | None) -> None:
    if interpreted is None:
        getattr(checks, name)()
    else:
        assert interpreted[name] is None, interpreted[name]
