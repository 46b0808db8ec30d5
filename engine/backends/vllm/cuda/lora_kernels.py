"""Multi-LoRA linear kernels for the low-rank population on CUDA, launched per adapter block.

Why: vLLM 0.26's shrink and expand kernels (vllm/lora/ops/triton_ops) launch a program for
every block of the whole batch's tokens times every adapter slot (plus one), and each program
whose adapter has no tokens in that block exits. A low-rank step decodes 256 sequences over
32 adapters, 8 tokens an adapter: 31 of every 32 programs exit, and the shrink, without
split-K for determinism, walks the whole hidden size in one program per adapter and slice.
Profiled on an H200 at 1.07B, the two kernels took 0.41 s of the step's 0.74 s of GPU time
(with configurations tuned for the card, engine/backends/vllm/cuda/tuned_lora).

Here the grid is the batch's blocks of one adapter's tokens: tile t of cdiv(M, BLOCK_M) +
groups tiles is block t - first(g) of group g, where first(g) counts the blocks of the groups
before it (a group is an entry of vLLM's active adapter list, its tokens a run of the tokens
sorted by adapter; cdiv(M, BLOCK_M) + groups bounds the sum of every group's blocks, so the
grid is fixed for a batch size, as CUDA graphs need). The shrink splits K over programs, each
writing its partial product to its own plane of a scratch tensor, and the expand adds the
planes in order before its product: sums in a fixed order, no atomics, so a seed gives the same
bits every run without giving up the split.

Numerics follow vLLM's: the shrink accumulates in fp32 and scales; the expand rounds that to
the adapters' dtype, multiplies with fp32 accumulation, rounds to the output's dtype and adds
it to the output there (to nearest even, as the GPU does). The partial sums make the shrink's
last bits differ from vLLM's single sum.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

BLOCK_M = 16
"""Tokens a program takes (tl.dot's least); a decode step has a few tokens an adapter."""
BLOCK_K = 128
"""Shrink: the hidden size walked a load at a time."""
K_PER_SPLIT = 512
"""Shrink: the hidden size a program covers (its partial's share of K)."""
BLOCK_N = 128
"""Expand: output columns a program writes."""


@triton.jit
def _tile_group(t, lora_ids, tokens_per_lora, groups, BLOCK: tl.constexpr):
    """(group, first row of the block in the group's sorted tokens) of tile t; group -1 when
    t is past the last group's last block."""
    first = 0
    found = -1
    row = 0
    for g in range(groups):
        n = tl.load(tokens_per_lora + g)
        blocks = tl.where(tl.load(lora_ids + g) >= 0, (n + BLOCK - 1) // BLOCK, 0)
        hit = (t >= first) & (t < first + blocks) & (found < 0)
        found = tl.where(hit, g, found)
        row = tl.where(hit, (t - first) * BLOCK, row)
        first += blocks
    return found, row


@triton.jit
def _pick(s, p0, p1, p2):
    """Slice s's value of three (fused layers have up to three slices: q, k, v)."""
    value = p0
    if s == 1:
        value = p1
    if s == 2:
        value = p2
    return value


@triton.jit
def _rows(t, sorted_tokens, tokens_per_lora, token_start, lora_ids, groups, BLOCK: tl.constexpr):
    """(adapter slot, token rows, their mask) of tile t; slot -1 when the tile is empty."""
    g, row = _tile_group(t, lora_ids, tokens_per_lora, groups, BLOCK)
    known = tl.maximum(g, 0)
    lora = tl.where(g >= 0, tl.load(lora_ids + known), -1)
    offsets = row + tl.arange(0, BLOCK)
    mask = offsets < tl.where(g >= 0, tl.load(tokens_per_lora + known), 0)
    rows = tl.load(sorted_tokens + tl.load(token_start + known) + offsets, mask=mask, other=0)
    return lora, rows, mask


@triton.jit
def shrink(
    x, a0, a1, a2, parts, K, R, sorted_tokens, tokens_per_lora, token_start, lora_ids, groups,
    scale, x_stride, a_stride_lora, a_stride_rank, parts_stride_split, parts_stride_slice,
    k_per_split,
    BLOCK_M: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """parts[split, s, token, :R] = scale * x[token, K range of split] @ A_s[lora]^T."""
    lora, rows, m_mask = _rows(
        tl.program_id(0), sorted_tokens, tokens_per_lora, token_start, lora_ids, groups, BLOCK_M
    )
    if lora >= 0:
        s = tl.program_id(1)
        split = tl.program_id(2)
        a = _pick(s, a0, a1, a2) + lora * a_stride_lora
        ranks = tl.arange(0, BLOCK_R)
        r_mask = ranks < R
        acc = tl.zeros((BLOCK_M, BLOCK_R), dtype=tl.float32)
        for step in range(0, k_per_split, BLOCK_K):
            ks = split * k_per_split + step + tl.arange(0, BLOCK_K)
            k_mask = ks < K
            xt = tl.load(
                x + rows[:, None] * x_stride + ks[None, :],
                mask=m_mask[:, None] & k_mask[None, :],
                other=0.0,
            )
            at = tl.load(
                a + ranks[None, :] * a_stride_rank + ks[:, None],
                mask=r_mask[None, :] & k_mask[:, None],
                other=0.0,
            )
            acc += tl.dot(xt.to(tl.float32), at.to(tl.float32), input_precision="ieee")
        out = parts + split * parts_stride_split + s * parts_stride_slice
        tl.store(
            out + rows[:, None] * BLOCK_R + ranks[None, :],
            acc * scale,
            mask=m_mask[:, None] & r_mask[None, :],
        )


@triton.jit
def expand(
    parts, b0, b1, b2, y, n0, n1, n2, R, sorted_tokens, tokens_per_lora, token_start,
    lora_ids, groups, splits, y_stride, b_stride0, b_stride1, b_stride2, b_stride_row,
    parts_stride_split,
    parts_stride_slice,
    BLOCK_M: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr,
    ADD_INPUTS: tl.constexpr,
):  # fmt: skip
    """y[token, slice s's columns] (+)= round(sum of the parts, in order) @ B_s[lora]^T."""
    lora, rows, m_mask = _rows(
        tl.program_id(0), sorted_tokens, tokens_per_lora, token_start, lora_ids, groups, BLOCK_M
    )
    s = tl.program_id(2)
    width = _pick(s, n0, n1, n2)
    columns = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    if (lora >= 0) & (tl.program_id(1) * BLOCK_N < width):
        ranks = tl.arange(0, BLOCK_R)
        r_mask = ranks < R
        mask = m_mask[:, None] & r_mask[None, :]
        plane = parts + s * parts_stride_slice + rows[:, None] * BLOCK_R + ranks[None, :]
        acc = tl.zeros((BLOCK_M, BLOCK_R), dtype=tl.float32)
        for split in range(splits):
            acc += tl.load(plane + split * parts_stride_split, mask=mask, other=0.0)
        b = _pick(s, b0, b1, b2) + lora * _pick(s, b_stride0, b_stride1, b_stride2)
        n_mask = columns < width
        bt = tl.load(
            b + columns[None, :] * b_stride_row + ranks[:, None],
            mask=n_mask[None, :] & r_mask[:, None],
            other=0.0,
        )
        rounded = acc.to(bt.dtype, fp_downcast_rounding="rtne").to(tl.float32)
        product = tl.dot(rounded, bt.to(tl.float32), input_precision="ieee")
        start = tl.where(s > 0, n0, 0) + tl.where(s > 1, n1, 0)
        target = y + rows[:, None] * y_stride + start + columns[None, :]
        out_mask = m_mask[:, None] & n_mask[None, :]
        out = product.to(y.dtype.element_ty, fp_downcast_rounding="rtne")
        if ADD_INPUTS:
            total = out.to(tl.float32) + tl.load(target, mask=out_mask).to(tl.float32)
            out = total.to(y.dtype.element_ty, fp_downcast_rounding="rtne")
        tl.store(target, out, mask=out_mask)


def _three(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The slices' weights as [loras, rows, cols] views, padded to three with the first."""
    views = [t.squeeze(1) if t.ndim == 4 else t for t in tensors]
    if len(views) > 3:
        raise ValueError(f"a fused layer of {len(views)} slices (at most 3 are supported)")
    return views + [views[0]] * (3 - len(views))


def lora_linear(
    y: torch.Tensor,
    x: torch.Tensor,
    lora_a: Sequence[torch.Tensor],
    lora_b: Sequence[torch.Tensor],
    scale: float,
    output_slices: Sequence[int],
    add_inputs: bool,
    sorted_tokens: torch.Tensor,
    tokens_per_lora: torch.Tensor,
    token_start: torch.Tensor,
    lora_ids: torch.Tensor,
    groups: int,
) -> None:
    """y[:, slice s] (+)= (x @ A_s[lora(token)]^T * scale) @ B_s[lora(token)]^T for every
    token with an adapter, in place; vLLM's LoRAKernelMeta gives the tokens sorted by adapter
    (`sorted_tokens`), each group's count and start and its adapter slot (-1: none), and
    `groups` bounds the groups holding tokens. x is [M, K], y [M, sum(output_slices)], A_s
    [loras, (1,) R, K], B_s [loras, (1,) N_s, R], all contiguous."""
    m, k = x.shape
    a = _three(lora_a)
    b = _three(lora_b)
    rank = a[0].shape[1]
    block_r = max(16, triton.next_power_of_2(rank))
    splits = triton.cdiv(k, K_PER_SPLIT)
    slices = len(output_slices)
    parts = torch.empty((splits, slices, m, block_r), dtype=torch.float32, device=x.device)
    tiles = triton.cdiv(m, BLOCK_M) + int(groups)
    widths = [int(n) for n in output_slices] + [0] * (3 - slices)
    shrink[(tiles, slices, splits)](
        x, a[0], a[1], a[2], parts, k, rank, sorted_tokens, tokens_per_lora, token_start,
        lora_ids, lora_ids.numel(), float(scale), x.stride(0), a[0].stride(0),
        a[0].stride(1), parts.stride(0), parts.stride(1), K_PER_SPLIT,
        BLOCK_M=BLOCK_M, BLOCK_R=block_r, BLOCK_K=BLOCK_K,
    )  # fmt: skip
    expand[(tiles, triton.cdiv(max(widths), BLOCK_N), slices)](
        parts, b[0], b[1], b[2], y, *widths, rank, sorted_tokens, tokens_per_lora,
        token_start, lora_ids, lora_ids.numel(), splits, y.stride(0), b[0].stride(0),
        b[1].stride(0), b[2].stride(0), b[0].stride(1), parts.stride(0), parts.stride(1),
        BLOCK_M=BLOCK_M, BLOCK_R=block_r, BLOCK_N=BLOCK_N, ADD_INPUTS=bool(add_inputs),
    )  # fmt: skip
