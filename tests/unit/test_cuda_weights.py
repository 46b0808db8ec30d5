"""The one-launch weight kernels of CUDA engines (tests/unit/cuda_weight_checks.py): compiled
and bit for bit against the torch path on a GPU (bench/gpu/run_tests.sh runs this file there);
elsewhere in Triton's interpreter, in a fresh process (tests/unit/triton_checks.py)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from tests.unit import cuda_weight_checks as checks  # noqa: E402
from tests.unit import triton_checks  # noqa: E402


@pytest.fixture(scope="module")
def outcomes() -> dict[str, str | None] | None:
    """Every check's outcome with Triton's interpreter on; None on a GPU."""
    return None if checks.ON_GPU else triton_checks.interpreted("tests.unit.cuda_weight_checks")


@pytest.mark.parametrize("name", triton_checks.check_names(vars(checks)))
def test_weight_kernel(name: str, outcomes: dict[str, str | None] | None) -> None:
    triton_checks.run(name, getattr(checks, name), outcomes)
