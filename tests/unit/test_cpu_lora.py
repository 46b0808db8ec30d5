"""The grouped CPU multi-LoRA kernels give what vLLM's per-token torch ops give."""

from __future__ import annotations

import pytest
import torch

from engine.backends.vllm.cpu import features as cpu_features
from engine.backends.vllm.cpu import lora_kernels as cpu_lora
from engine.backends.vllm.cpu import native as cpu_lora_native

torch_ops = pytest.importorskip("vllm.lora.ops.torch_ops")


def _case(tokens=37, adapters=5, rank=8, width=24, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, width, generator=g)
    a = torch.randn(adapters, 1, rank, width, generator=g)
    b = torch.randn(adapters, 1, width, rank, generator=g)
    indices = torch.randint(0, adapters, (tokens,), generator=g)
    return x, a, b, indices


def test_shrink_and_expand_match_vllm():
    x, a, b, indices = _case()
    ours, theirs = torch.zeros(37, 8), torch.zeros(37, 8)
    cpu_lora.bgmv_shrink(x, a, ours, indices, 0.5)
    torch_ops.bgmv_shrink(x, a, theirs, indices, 0.5)
    torch.testing.assert_close(ours, theirs)
    y0 = torch.randn(37, 24)
    ours_y, theirs_y = y0.clone(), y0.clone()
    cpu_lora.bgmv_expand(ours, b, ours_y, indices, add_inputs=True)
    torch_ops.bgmv_expand(theirs, b, theirs_y, indices, add_inputs=True)
    torch.testing.assert_close(ours_y, theirs_y)
    ours_s, theirs_s = torch.zeros(37, 40), torch.zeros(37, 40)
    cpu_lora.bgmv_expand_slice(ours, b, ours_s, indices, 10, 24, add_inputs=False)
    torch_ops.bgmv_expand_slice(theirs, b, theirs_s, indices, 10, 24, add_inputs=False)
    torch.testing.assert_close(ours_s, theirs_s)


def test_segmented_variants_expand_sequences_to_tokens():
    x, a, _, _ = _case(tokens=10)
    seq_lens, seq_loras = torch.tensor([3, 5, 2]), torch.tensor([4, 0, 4])
    ours, theirs = torch.zeros(10, 8), torch.zeros(10, 8)
    args = (torch.tensor([0, 3, 8]), seq_lens, seq_loras, 3, 5, 10)
    cpu_lora.sgmv_shrink(x, a, ours, *args, 2.0)
    torch_ops.sgmv_shrink(x, a, theirs, *args, 2.0)
    torch.testing.assert_close(ours, theirs)


def test_tokens_without_an_adapter_get_no_lora_term():
    x, a, _, indices = _case(tokens=6)
    indices = torch.tensor([2, -1, 2, 0, -1, 3])
    out = cpu_lora.lora_matmul(x, a, indices)
    assert torch.count_nonzero(out[[1, 4]]) == 0
    torch.testing.assert_close(out[0], x[0] @ a[2, 0].T)
    assert torch.count_nonzero(cpu_lora.lora_matmul(x, a, torch.full((6,), -1))) == 0


def test_install_points_the_cpu_punica_wrapper_at_the_grouped_kernels():
    from vllm.lora.punica_wrapper import punica_cpu

    assert cpu_lora.install_grouped_cpu_lora()
    assert punica_cpu.sgmv_shrink is cpu_lora.sgmv_shrink
    assert punica_cpu.bgmv_expand_slice is cpu_lora.bgmv_expand_slice


def test_a_reused_plan_follows_indices_changed_in_place():
    x, a, _, _ = _case(tokens=4)
    indices = torch.tensor([0, 1, 2, 3])
    first = cpu_lora.lora_matmul(x, a, indices)
    indices[:] = torch.tensor([3, 3, -1, 0])  # the same tensor, new values (next step)
    second = cpu_lora.lora_matmul(x, a, indices)
    torch.testing.assert_close(first[0], x[0] @ a[0, 0].T)
    torch.testing.assert_close(second[0], x[0] @ a[3, 0].T)
    assert torch.count_nonzero(second[2]) == 0


@pytest.fixture
def torch_path(monkeypatch):
    """add_lora_linear as on a machine without a C compiler: the per-token kernel is absent."""
    monkeypatch.setattr(cpu_lora_native, "kernel", lambda: None)
    monkeypatch.setattr(cpu_lora, "_last_plan", None)


@pytest.mark.parametrize("lowest", [-1, 0], ids=["some-base-tokens", "all-adapters"])
@pytest.mark.parametrize(("dtype", "ops"), [(torch.float32, torch_ops), (torch.bfloat16, cpu_lora)])
def test_fused_slices_match_vllms_shrink_and_expand_per_slice(dtype, ops, lowest, torch_path):
    """add_lora_linear (q, k, v of one layer at once) against vLLM's semantics: per slice, a
    float32 shrink, then an expand added into y's column slice; -1 tokens untouched. In bf16
    against the per-slice grouped kernels: vLLM's torch ops round the float32 shrink to bf16
    before the expand, which the grouped kernels (and the fused one) do not."""
    x, a, b, indices, y0, slices = _fused_case(dtype, lowest)
    used = indices >= 0  # vLLM's torch ops would index adapter -1 (the last): leave them out
    part, offset = y0[used].clone(), 0
    for a_s, b_s, size in zip(a, b, slices, strict=True):
        buffer = torch.zeros(int(used.sum()), a_s.shape[2])
        ops.bgmv_shrink(x[used], a_s, buffer, indices[used], 0.25)
        ops.bgmv_expand_slice(buffer, b_s, part, indices[used], offset, size, True)
        offset += size
    expected = y0.clone()
    expected[used] = part
    ours = _add_lora_linear(x, a, b, indices, y0, slices)
    torch.testing.assert_close(ours, expected)
    assert torch.equal(ours[indices < 0], y0[indices < 0])


@pytest.mark.parametrize("lowest", [-1, 0], ids=["some-base-tokens", "all-adapters"])
@pytest.mark.parametrize("width", [24, 36], ids=["whole-vectors", "vector-tails"])
def test_the_per_token_kernel_rounds_the_exact_sum_once(lowest, width):
    """The C kernel (built here: CI has a compiler) takes decode-like bf16 tokens: each y
    entry is the fp32 sum of y, shrink and expand rounded to bf16 once, so it is within half
    a bf16 step (2^-8 relative) of the exact value, give or take fp32 rounding; -1 tokens
    and columns past the slices are untouched. Widths that are not a multiple of the vector
    length take the tails."""
    assert cpu_lora_native.kernel() is not None
    cpu_lora._last_plan = None
    x, a, b, indices, y0, slices = _fused_case(torch.bfloat16, lowest, width)
    wide = torch.cat([y0, torch.ones(y0.shape[0], 3, dtype=y0.dtype)], 1)
    ours = _add_lora_linear(x, a, b, indices, wide, slices)
    assert cpu_lora._plan(indices).blocks == ()

    def lora_term(f):
        return 0.25 * torch.cat(
            [
                torch.einsum("ti,tri,tor->to", f(x), f(a_s)[indices, 0], f(b_s)[indices, 0])
                for a_s, b_s in zip(a, b, strict=True)
            ],
            1,
        )

    exact = y0.float() + lora_term(lambda t: t.float())
    magnitude = y0.float().abs() + lora_term(lambda t: t.float().abs())
    used = indices >= 0
    error = (ours[used, :-3].float() - exact[used]).abs()
    # fp32 sums in another order differ by ~1e-8 of the terms' magnitude
    assert (error <= exact[used].abs() * 2**-8 + 1e-6 * magnitude[used]).all()
    assert torch.equal(ours[~used], wide[~used]) and torch.equal(ours[:, -3:], wide[:, -3:])


def _fused_case(dtype, lowest, width=24):
    g = torch.Generator().manual_seed(1)
    tokens, adapters, rank, slices = 29, 6, 8, (width, 8, 12)
    x = torch.randn(tokens, width, generator=g).to(dtype)
    a = tuple(torch.randn(adapters, 1, rank, width, generator=g).to(dtype) for _ in slices)
    b = tuple(torch.randn(adapters, 1, size, rank, generator=g).to(dtype) for size in slices)
    indices = torch.randint(lowest, adapters, (tokens,), generator=g)
    y0 = torch.randn(tokens, sum(slices), generator=g).to(dtype)
    return x, a, b, indices, y0, slices


def _add_lora_linear(x, a, b, indices, y0, slices):
    wrapper = type("Wrapper", (), {"token_lora_indices": indices})()
    y = y0.clone()
    cpu_lora.add_lora_linear(wrapper, y, x, a, b, 0.25, slices)
    return y


@pytest.mark.parametrize("tokens", [12, 400], ids=["decode-sized", "prefill-sized"])
def test_bf16_lora_matches_fp32_math_within_bf16_rounding(tokens):
    """Short rows take the fp32 shrink, long rows (prefill) the bf16 one: both within bf16
    rounding of the same product computed in fp32."""
    x, a, _, indices = _case(tokens=tokens, adapters=4, width=64)
    assert (cpu_lora._plan(indices).rows < cpu_lora.SMALL_ROWS) == (tokens == 12)
    ours = cpu_lora.lora_matmul(x.bfloat16(), a.bfloat16(), indices, dtype=torch.float32)
    exact = torch.einsum("ti,tri->tr", x.bfloat16().float(), a.bfloat16().float()[indices, 0])
    torch.testing.assert_close(ours, exact, rtol=2e-2, atol=2e-2)


def test_blocked_tokens_give_what_the_gathered_path_gives(monkeypatch):
    """Prefill-like indices (runs of one adapter, a cut run at each end) take the in-place
    block path, with rank trimmed to the rows any slot uses; the result equals the gathered
    path's, and weights written later are seen once weights_changed() is called. Blocks
    are formed where the CPU multiplies bf16 in hardware (else the C kernel takes all)."""
    monkeypatch.setattr(cpu_features, "bf16_matmul_in_hardware", lambda: True)
    g = torch.Generator().manual_seed(3)
    adapters, rank, width, slices = 6, 8, 32, (32, 16)
    a = tuple(torch.zeros(adapters, 1, rank, width) for _ in slices)
    b = tuple(torch.zeros(adapters, 1, size, rank) for size in slices)
    for w in a:
        w[:, :, :3] = torch.randn(adapters, 1, 3, width, generator=g)  # rank 3 in rank-8 slots
    for w in b:
        w[..., :3] = torch.randn(*w.shape[:-1], 3, generator=g)
    indices = torch.tensor([5] * 100 + [0] * 300 + [1] * 300 + [2] * 300 + [4] * 40)
    blocks, rest = cpu_lora._blocks(indices)
    assert [(blk.rows, blk.adapters.tolist(), blk.first) for blk in blocks] == [
        (100, [5], 5),
        (300, [0, 1, 2], 0),
        (40, [4], 4),
    ]
    assert (rest == -1).all()
    x = torch.randn(indices.numel(), width, generator=g)
    y0 = torch.randn(indices.numel(), sum(slices), generator=g)
    wrapper = type("Wrapper", (), {"token_lora_indices": indices})()

    def run(max_blocks: int) -> torch.Tensor:
        monkeypatch.setattr(cpu_lora, "MAX_BLOCKS", max_blocks)
        cpu_lora._last_plan = None
        y = y0.clone()
        cpu_lora.add_lora_linear(wrapper, y, x, a, b, 0.5, slices)
        return y

    blocked = run(16)
    assert len(cpu_lora._plan(indices).blocks) == 3
    torch.testing.assert_close(blocked, run(0))
    torch.testing.assert_close(blocked, run(2))  # two blocks, the last run gathered
    terms = [
        torch.einsum("ti,tri,tor->to", x, a_s[indices, 0], b_s[indices, 0])
        for a_s, b_s in zip(a, b, strict=True)
    ]
    expected = y0 + 0.5 * torch.cat(terms, 1)
    torch.testing.assert_close(blocked, expected, rtol=1e-4, atol=1e-4)
    a[0][0, 0, 7] = 1.0  # a slot written in place, now of rank 8
    cpu_lora.weights_changed()
    assert cpu_lora._fused_weights(a, b, slices).a_t.shape[-1] == 8 * len(slices)  # S x r


def test_short_runs_are_gathered_unless_one_block_holds_every_token():
    decode = torch.arange(8).repeat_interleave(4)  # 8 members x 4 sequences, one token each
    blocks, rest = cpu_lora._blocks(decode)
    assert [(b.rows, b.first) for b in blocks] == [(4, 0)] and (rest == -1).all()
    finished = torch.cat([decode[:13], decode[14:]])  # a sequence finished: runs of 4 and 3
    blocks, rest = cpu_lora._blocks(finished)
    assert blocks == () and torch.equal(rest, finished)
    mixed = torch.cat([torch.tensor([3, 1, -1]), torch.full((40,), 2)])  # decode + prefill
    blocks, rest = cpu_lora._blocks(mixed)
    assert [(b.start, b.rows) for b in blocks] == [(3, 40)]
    assert rest.tolist() == [3, 1, -1] + [-1] * 40


def test_member_slots_are_sorted_over_the_slots_they_hold():
    from engine.backends.vllm.lora_slots import MEMBER_ID_BASE, _sort_member_slots

    ids = [MEMBER_ID_BASE + 3, None, 7, MEMBER_ID_BASE + 1, MEMBER_ID_BASE + 2]
    _sort_member_slots(ids)
    assert ids == [MEMBER_ID_BASE + 1, None, 7, MEMBER_ID_BASE + 2, MEMBER_ID_BASE + 3]
