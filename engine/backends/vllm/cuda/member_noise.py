"""Full-rank members' noise products on CUDA (`perturbation: full_batched`,
engine/backends/vllm/member_noise.py): one Triton kernel a linear layer, inside vLLM's
CUDA graphs.

For every token t of member m (its LoRA slot): y[t] += s_m * x[t] @ eps_m^T, eps_m the
member's [N, K] block of the noise table. The grid is the batch's blocks of one slot's
tokens (vLLM's LoRAKernelMeta sorts the tokens by slot; the tile -> block mapping is
`_tile_slot`'s) times blocks of output columns. A program reads its member's noise tile once
for all of its tokens, so the noise is read once per BLOCK_M tokens of a member: 8 decode
tokens a member take one read a step, and a prefill of hundreds of tokens a member takes
larger token blocks (`block_m`). An antithetic pair (one seed, scales +s and -s) in slots next
to each other reads its block once for both members' tokens (`_tile_slot`): half the noise
read of a population in pairs. Each output element is written by one program, in one
rounding (y's value in fp32 plus the product, rounded to nearest even), so the result does
not depend on the launch order: a seed gives the same bits every run.

The member's offset, the table's address and its scale come from the slot's header in the
layer's LoRA buffer (member_noise.HEADER), read by the kernel: CUDA graphs captured when
vLLM started, before the table existed, then serve every step's members. A scale of 0 (a
slot without a member there, or a layer the run does not perturb) skips the product.

bench/gpu/shared_reads.py and bench/gpu/shared_noise_engine.py measured the same product
(`_noise_product` there) with members in fixed rows; the tiles (64 output rows by 64 of K)
are the ones found fastest there. bench/gpu/member_noise_kernel.py times this kernel on a
model's layers for other tiles (`launch`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import triton
import triton.language as tl

BLOCK_N = 64
"""Output columns a program computes (rows of the noise block)."""
BLOCK_K = 64
"""The input width walked a load at a time."""
DECODE_BLOCK_M = 16
"""Tokens a program takes while members have few tokens each (tl.dot's least)."""
PREFILL_BLOCK_M = 64
"""Tokens a program takes when members average this many or more in the pass (prefill)."""
ALIGN = tl.constexpr(8)
"""Noise entries a vector load reads (16 bytes of bf16). The kernel reads up to ALIGN - 1
entries past a block, so the worker's table is followed by engine.noise.TABLE_SLACK more."""


@triton.jit
def _same_block_as_next(g, lora_ids, groups, words, header_words):
    """Whether group g and group g + 1 are members whose headers name the same noise block
    (an antithetic pair: one seed, scales +s and -s, in slots that vLLM lists side by side)."""
    slot = tl.load(lora_ids + g)
    inside = g + 1 < groups
    nxt = tl.load(lora_ids + g + 1, mask=inside, other=-1)
    both = inside & (slot >= 0) & (nxt >= 0)
    mine = tl.load(words + slot * header_words, mask=both, other=0)
    theirs = tl.load(words + nxt * header_words, mask=both, other=1)
    return both & (mine == theirs)


@triton.jit
def _tile_slot(t, lora_ids, tokens_per_lora, groups, words, header_words, BLOCK: tl.constexpr):
    """(group, first row of the block in the group's sorted tokens, whether the tile also
    takes the same rows of group + 1, its pair) of tile t; group -1 when t is past the last
    group's last block. Groups are vLLM's active adapter entries, listed by slot; one of slot
    -1 (tokens without a member) takes no blocks, nor does the second member of a pair. Pairs
    are found left to right, so no group is in two (three members of one block: a pair and
    one alone), and every program finds the same ones."""
    first = 0
    found = -1
    row = 0
    paired = 0
    second = 0  # whether group g is the second of a pair (group g - 1 takes its tiles)
    for g in range(groups):
        n = tl.load(tokens_per_lora + g)
        pair = (_same_block_as_next(g, lora_ids, groups, words, header_words) & (second == 0)).to(
            tl.int32
        )
        n = tl.maximum(n, tl.load(tokens_per_lora + g + 1, mask=pair != 0, other=0))
        live = (tl.load(lora_ids + g) >= 0) & (second == 0)
        blocks = tl.where(live, (n + BLOCK - 1) // BLOCK, 0)
        hit = (t >= first) & (t < first + blocks) & (found < 0)
        found = tl.where(hit, g, found)
        row = tl.where(hit, (t - first) * BLOCK, row)
        paired = tl.where(hit, pair, paired)
        first += blocks
        second = pair
    return found, row, paired


@triton.jit
def _member_tokens(
    g, present, row, sorted_tokens, tokens_per_lora, token_start, BLOCK_M: tl.constexpr
):
    """(token indices, which of them exist) of rows row.. of group g's sorted tokens; none
    unless `present` (g may then be past the last group)."""
    block = row + tl.arange(0, BLOCK_M)
    live = block < tl.load(tokens_per_lora + g, mask=present, other=0)
    tokens = tl.load(sorted_tokens + tl.load(token_start + g) + block, mask=live, other=0)
    return tokens, live


@triton.jit
def _inputs(x, x_stride, tokens, live, ks, K):
    """x[tokens, ks]^T: the [BLOCK_K, BLOCK_M] input tile of a member's tokens, zero at
    inputs outside 0..K-1."""
    return tl.load(
        x + tokens[None, :] * x_stride + ks[:, None],
        mask=live[None, :] & (ks[:, None] >= 0) & (ks[:, None] < K),
        other=0.0,
    )


@triton.jit
def _add_product(y, y_stride, tokens, live, columns, N, scale, acc):
    """y[tokens, columns] += scale * acc, in one rounding of y's fp32 value plus the product."""
    out = y + tokens[None, :] * y_stride + columns[:, None]
    mask = live[None, :] & (columns[:, None] < N)
    before = tl.load(out, mask=mask, other=0.0).to(tl.float32)
    total = before + scale * acc
    tl.store(out, total.to(y.dtype.element_ty, fp_downcast_rounding="rtne"), mask=mask)


@triton.jit
def member_noise_kernel(
    x, y, words, floats, sorted_tokens, tokens_per_lora, token_start, lora_ids, groups,
    N, K, x_stride, y_stride, header_words, header_floats,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """y[tokens of the tile's member, columns] += s * eps[columns, :] @ x[tokens]^T; a tile
    of an antithetic pair does the same for the pair's second member's tokens (its own
    scale), with each noise tile loaded once for both.

    A member's block starts at any entry of the table, so the noise is read from the
    ALIGN-aligned entry at or before it, `shift` entries early: in whole 16-byte vectors,
    which Triton then streams asynchronously (unaligned, it loaded 2 bytes at a time, and the
    1.07B model's noise was read at about 1 TB/s of an H100's 3.35: docs/gpu.md). Loaded
    column j holds the noise of input j - shift, so the inputs are read shifted instead; the
    window's extra columns meet zero inputs."""
    g, row, paired = _tile_slot(
        tl.program_id(0), lora_ids, tokens_per_lora, groups, words, header_words, BLOCK_M
    )
    if g >= 0:
        slot = tl.load(lora_ids + g)
        scale = tl.load(floats + slot * header_floats + 4)
        # the pair's second member, group g + 1 (no tokens and scale 0 when unpaired)
        slot_b = tl.load(lora_ids + g + 1, mask=paired != 0, other=0)
        scale_b = tl.load(floats + slot_b * header_floats + 4, mask=paired != 0, other=0.0)
        if (scale != 0.0) | (scale_b != 0.0):
            offset = tl.load(words + slot * header_words)
            shift = (offset % ALIGN).to(tl.int32)
            table = tl.load(words + slot * header_words + 1).to(tl.pointer_type(x.dtype.element_ty))
            block = tl.multiple_of(table, 16) + tl.multiple_of(offset - shift, ALIGN)
            tokens, live = _member_tokens(
                g, g >= 0, row, sorted_tokens, tokens_per_lora, token_start, BLOCK_M
            )
            tokens_b, live_b = _member_tokens(
                g + 1, paired != 0, row, sorted_tokens, tokens_per_lora, token_start, BLOCK_M
            )
            columns = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
            acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
            acc_b = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
            for j0 in range(0, K + shift, BLOCK_K):
                js = j0 + tl.arange(0, BLOCK_K)
                eps = tl.load(
                    block + columns[:, None] * K + js[None, :],
                    mask=(columns[:, None] < N) & (js[None, :] < K + ALIGN),
                    other=0.0,
                )
                ks = js - shift
                acc = tl.dot(eps, _inputs(x, x_stride, tokens, live, ks, K), acc)
                if paired != 0:
                    acc_b = tl.dot(eps, _inputs(x, x_stride, tokens_b, live_b, ks, K), acc_b)
            if scale != 0.0:
                _add_product(y, y_stride, tokens, live, columns, N, scale, acc)
            if (paired != 0) & (scale_b != 0.0):
                _add_product(y, y_stride, tokens_b, live_b, columns, N, scale_b, acc_b)


def block_m(tokens: int, groups: int) -> int:
    """Tokens a program takes: more while members have many tokens each in the pass."""
    return PREFILL_BLOCK_M if tokens >= PREFILL_BLOCK_M * max(1, groups) else DECODE_BLOCK_M


def member_noise(
    y: torch.Tensor,
    x: torch.Tensor,
    headers: torch.Tensor,
    out_features: int,
    sorted_tokens: torch.Tensor,
    tokens_per_lora: torch.Tensor,
    token_start: torch.Tensor,
    lora_ids: torch.Tensor,
    no_lora_flag_cpu: torch.Tensor,
    num_active_loras: torch.Tensor,
) -> None:
    """The kernel's launch, and the body of the op vLLM's graphs capture: x [M, K], y [M, >=
    out_features] (rows contiguous), `headers` a layer's lora_a_stacked[0]; the rest is
    vLLM's token mapping (LoRAKernelMeta.meta_args), its two flags CPU tensors as in vLLM's
    LoRA ops (no wait on the GPU): no token has a member, and the groups holding tokens."""
    mapping = sorted_tokens, tokens_per_lora, token_start, lora_ids
    launch(y, x, headers, out_features, mapping, no_lora_flag_cpu, num_active_loras, {})


def launch(
    y: torch.Tensor,
    x: torch.Tensor,
    headers: torch.Tensor,
    out_features: int,
    mapping: Sequence[torch.Tensor],
    no_lora_flag_cpu: torch.Tensor,
    num_active_loras: torch.Tensor,
    tiles: Mapping[str, int],
) -> None:
    """member_noise, vLLM's token mapping tensors in `mapping` (sorted tokens, tokens a
    group, group starts, group slots), with `tiles` overriding the launch's BLOCK_N, BLOCK_K,
    num_warps and num_stages: the kernel bench's search (bench/gpu/member_noise_kernel.py).
    The op keeps member_noise's signature, from which torch infers its schema."""
    from engine.backends.vllm.member_noise import header_views

    if bool(no_lora_flag_cpu.item()):
        return
    groups = int(num_active_loras.item())
    m, k = x.shape
    words, floats = header_views(headers)
    lora_ids = mapping[3]
    tile = block_m(m, groups)
    options = {"BLOCK_N": BLOCK_N, "BLOCK_K": BLOCK_K, **tiles}
    grid = (triton.cdiv(m, tile) + groups, triton.cdiv(out_features, options["BLOCK_N"]))
    member_noise_kernel[grid](
        x, y, words, floats, *mapping, lora_ids.numel(), out_features, k, x.stride(0),
        y.stride(0), words.stride(0), floats.stride(0), BLOCK_M=tile, **options,
    )  # fmt: skip


# ---- inside vLLM ------------------------------------------------------------------------------


def register_op() -> None:
    """Define `vllm::eslab_member_noise_linear` (once a process), before vLLM traces the
    model: a registered op is opaque to torch.compile and captured into the CUDA graphs like
    vLLM's own LoRA ops. (bench/gpu/shared_noise_engine.py registers an op of its own,
    `eslab_member_noise`.)"""
    if hasattr(torch.ops.vllm, "eslab_member_noise_linear"):
        return
    from vllm.utils.torch_utils import direct_register_custom_op

    direct_register_custom_op(
        op_name="eslab_member_noise_linear",
        op_func=member_noise,
        mutates_args=["y"],
        fake_impl=_member_noise_fake,
    )


def add_noise_products(
    wrapper: Any, y: torch.Tensor, x: torch.Tensor, headers: torch.Tensor, out_features: int
) -> None:
    """member_noise.add_noise_products on CUDA, from vLLM's PunicaWrapperGPU's token
    mapping (as its own LoRA kernels read it)."""
    x = x.reshape(-1, x.shape[-1]).contiguous()
    meta = wrapper.token_mapping_meta.meta_args(
        x.size(0), wrapper.lora_config.specialize_active_lora
    )
    _, sorted_tokens, tokens_per_lora, token_start, lora_ids, no_lora, active = meta
    torch.ops.vllm.eslab_member_noise_linear(
        y.view(-1, y.shape[-1]), x, headers, int(out_features), sorted_tokens,
        tokens_per_lora, token_start, lora_ids, no_lora, active,
    )  # fmt: skip


def _member_noise_fake(*args: Any) -> None:
    """The op's shape function for torch.compile: it only writes y in place."""
