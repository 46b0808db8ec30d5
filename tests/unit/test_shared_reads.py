"""bench/gpu/shared_reads.py's kernels against torch on a small linear: compiled on a GPU,
elsewhere in Triton's interpreter in a fresh process (the interpreter must be on before
Triton is first imported, and vLLM imports it in this one). The interpreter's bf16 dots are
not the card's, so on a CPU the check runs in fp32: it checks the kernels' indexing (which
member's tokens meet which noise block, the antithetic pairs' halves and signs, the tiles'
edges), which is what a wrong figure from the bench would come from."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[2]
CHECK = (
    "import json, torch; from bench.gpu import shared_reads as s; "
    "print(json.dumps(s.check_kernels({tokens}, {members}, {bn}, {bk}, device={device!r}, "
    "dtype=torch.{dtype})))"
)


def checks(tokens: int, members: int, bn: int, bk: int) -> dict[str, float]:
    on_gpu = torch.cuda.is_available()
    code = CHECK.format(
        tokens=tokens,
        members=members,
        bn=bn,
        bk=bk,
        device="cuda" if on_gpu else "cpu",
        dtype="bfloat16" if on_gpu else "float32",
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if not on_gpu:
        env["TRITON_INTERPRET"] = "1"
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


# 8 tokens a member (a pair fills the 16-token tile) on a 64x64 tile; 5 tokens a member on
# 128-row tiles, which do not divide the linear's 192 rows, so that masked edges run too.
@pytest.mark.parametrize(("tokens", "bn", "bk"), [(8, 64, 64), (5, 128, 128)])
def test_the_shared_ways_compute_each_members_product(tokens: int, bn: int, bk: int) -> None:
    got = checks(tokens, 4, bn, bk)
    tolerance = 2e-2 if torch.cuda.is_available() else 1e-5
    assert got["noise_kernel_error"] < tolerance
    assert got["noise_pairs_kernel_error"] < tolerance
    assert got["exact_kernel_error"] < tolerance
    assert got["exact_bits_differ"] == 0.0
