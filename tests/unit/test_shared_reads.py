"""bench/gpu/shared_reads.py's kernels against torch on a small linear, and the member noise
that bench/gpu/shared_noise_engine.py adds to vLLM's layers with them: compiled on a GPU,
elsewhere in Triton's interpreter in a fresh process (the interpreter must be on before
Triton is first imported, and vLLM imports it in this one). The interpreter's bf16 dots are
not the card's, so on a CPU the check runs in fp32: it checks the kernels' indexing (which
member's tokens meet which noise block, the antithetic pairs' halves and signs, the tiles'
edges, the flag that switches a captured kernel on and off), which is what a wrong figure
from the bench would come from."""

from __future__ import annotations

import pytest

from tests.unit.fresh_process import checked_in_fresh_process

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

CHECK = (
    "import json, torch; from bench.gpu import shared_reads as s; "
    "print(json.dumps(s.check_kernels({tokens}, {members}, {bn}, {bk}, device={device!r}, "
    "dtype=torch.{dtype})))"
)


ON_GPU = torch.cuda.is_available()
DEVICE, DTYPE = ("cuda", "bfloat16") if ON_GPU else ("cpu", "float32")


# 8 tokens a member (a pair fills the 16-token tile) on a 64x64 tile; 5 tokens a member on
# 128-row tiles, which do not divide the linear's 192 rows, so that masked edges run too.
@pytest.mark.parametrize(("tokens", "bn", "bk"), [(8, 64, 64), (5, 128, 128)])
def test_the_shared_ways_compute_each_members_product(tokens: int, bn: int, bk: int) -> None:
    code = CHECK.format(tokens=tokens, members=4, bn=bn, bk=bk, device=DEVICE, dtype=DTYPE)
    got = checked_in_fresh_process(["-c", code], interpret=not ON_GPU)
    tolerance = 2e-2 if ON_GPU else 1e-5
    assert got["noise_kernel_error"] < tolerance
    assert got["noise_pairs_kernel_error"] < tolerance
    assert got["gated_on_error"] < tolerance
    assert got["gated_off_changed"] == 0.0
    assert got["exact_kernel_error"] < tolerance
    assert got["exact_bits_differ"] == 0.0


MEMBER_NOISE = """
import json, sys, torch
sys.path.insert(0, "bench/gpu")
import shared_noise_engine as e
e.TABLE_LEN = 1 << 16
noise = e.MemberNoise(members=4, tokens=8)
layer = torch.nn.Linear(128, 96, bias=False).to(DEVICE, torch.DTYPE)
noise.register(layer)
blocks = [noise.table[o : o + 96 * 128].view(96, 128) for o in noise.offsets[0].tolist()]
eps = torch.stack(blocks).float()
x = torch.randn(32, 128, device=DEVICE).to(torch.DTYPE)
plain = x @ layer.weight.T
def added(flag, rows=32):
    noise.flag.fill_(flag)
    out = x[:rows] @ layer.weight.T
    noise.add(out, x[:rows], layer.eslab_noise_index)
    return (out.float() - plain[:rows].float())
s = noise.scales[0].item()
xs = x.float().view(4, 8, 128)
members = s * torch.einsum("mtk,mnk->mtn", xs, eps).reshape(32, 96)
pairs = s * torch.einsum("mtk,mnk->mtn", xs, eps[[0, 1, 0, 1]]).reshape(32, 96)
first_two = s * torch.einsum("mtk,mnk->mtn", xs[:2], eps[[0, 0]]).reshape(16, 96)
noise.flag.fill_(1)
longer = torch.cat([x, x])
out = longer @ layer.weight.T
before = out.clone()
noise.add(out, longer, layer.eslab_noise_index)
print(json.dumps({
    "longer_pass_changed": (out != before).float().mean().item(),
    "index": layer.eslab_noise_index,
    "off": added(0).abs().max().item(),
    "members": (added(1) - members).abs().max().item() / members.abs().max().item(),
    "pairs": (added(2) - pairs).abs().max().item() / pairs.abs().max().item(),
    "pairs_of_16_rows": (added(2, 16) - first_two).abs().max().item()
    / first_two.abs().max().item(),
}))
"""


def test_the_engine_bench_adds_each_members_noise_by_the_flag() -> None:
    """Rows 8m..8m+7 are member m: its own block at 1, one block a pair at 2 (members m and
    m + members/2 of the rows present), nothing at 0, nor in a pass of more rows than the
    population has (a prefill)."""
    code = MEMBER_NOISE.replace("DEVICE", repr(DEVICE)).replace("DTYPE", DTYPE)
    got = checked_in_fresh_process(["-c", code], interpret=not ON_GPU)
    tolerance = 2e-2 if ON_GPU else 1e-5
    assert got["index"] == 0
    assert got["off"] == 0.0
    assert got["members"] < tolerance
    assert got["pairs"] < tolerance
    assert got["pairs_of_16_rows"] < tolerance
    assert got["longer_pass_changed"] == 0.0
