"""Full-rank members' noise products on CUDA (`perturbation: full_batched`,
engine/backends/vllm/member_noise.py): two Triton kernels a linear layer, inside vLLM's
CUDA graphs.

For every token t of member m (its LoRA slot): y[t] += s_m * x[t] @ eps_m^T, eps_m the
member's [N, K] block of the noise table. The first kernel stages the inputs as the second
multiplies them: each token's row shifted to its member's block's alignment, so that all of
the second's loads are whole aligned vectors. vLLM's LoRAKernelMeta sorts the tokens by slot,
so the tokens of members in neighbouring slots are contiguous; members of one noise block side
by side (an antithetic pair: one seed, scales +s and -s, which the engine places in
neighbouring slots) are one run, and the grid is the blocks of BLOCK_M tokens of each run
(`_tile_run`) times blocks of output columns. A program reads its run's noise tile once for
all of its tokens, each token taking its own member's scale: 8 decode tokens a member take
one read a step, a pair's 16 one read for both, and a prefill of hundreds of tokens a member
takes larger token blocks (`block_m`). Each output element is written by one program, in one
rounding (y's value in fp32 plus the product, rounded to nearest even), so the result does
not depend on the launch order: a seed gives the same bits every run.

The member's offset, the table's address and its scale come from the slot's header in the
layer's LoRA buffer (member_noise.HEADER), read by the kernel: CUDA graphs captured when
vLLM started, before the table existed, then serve every step's members. A scale of 0 (a
slot without a member there, or a layer the run does not perturb) skips the product.

bench/gpu/shared_reads.py and bench/gpu/shared_noise_engine.py measured the same product
(`_noise_product` there) with members in fixed rows; the tiles (64 output rows by 64 of K)
were the ones found fastest there; bench/gpu/member_noise_kernel.py times this kernel on a
model's layers for other tiles (`launch`), and BLOCK_N is the one it found fastest on an H100
(bench/gpu/results/member-noise-kernel/).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import triton
import triton.language as tl

BLOCK_N = 128
"""Output columns a program computes (rows of the noise block)."""
BLOCK_K = 64
"""The input width walked a load at a time."""
DECODE_BLOCK_M = 16
"""Tokens a program takes while members have few tokens each (tl.dot's least)."""
PREFILL_BLOCK_M = 64
"""Tokens a program takes when members average this many or more in the pass (prefill)."""
STAGE_BLOCK = 1024
"""Entries of a staged input row a program writes."""
ALIGN = tl.constexpr(8)
"""Noise entries a vector load reads (16 bytes of bf16). The kernel reads up to ALIGN - 1
entries past a block, so the worker's table is followed by engine.noise.TABLE_SLACK more."""


@triton.jit
def _latest(a, b):
    """The scan of `_tile_run`: the later of two indices (or of two nondecreasing sums)."""
    return tl.maximum(a, b)


@triton.jit
def _neighbour_words(lora_ids, groups, words, header_words, g):
    """(slot of group g, first word of its header: the member's noise offset) for a vector of
    group indices, slot -1 outside 0..groups-1."""
    slot = tl.load(lora_ids + g, mask=(g >= 0) & (g < groups), other=-1)
    return slot, tl.load(words + slot * header_words, mask=slot >= 0, other=0)


@triton.jit
def _tile_run(
    t, lora_ids, tokens_per_lora, groups, words, header_words,
    BLOCK: tl.constexpr, GROUPS: tl.constexpr,
):  # fmt: skip
    """(first group of the run, first row of the tile in the run's sorted tokens, the run's
    token count) of tile t; group -1 when t is past the last run's last block. Groups are
    vLLM's active adapter entries, listed by slot; a run is one group, or neighbouring groups
    whose members share a noise block (their tokens follow each other in vLLM's sorted order),
    and the group of slot -1 (tokens without a member) is in none. Every program finds the
    same runs.

    All groups at once, GROUPS (a power of two, at least `groups`) wide: their headers in one
    gather and the runs from scans in registers. A walk over the groups one at a time waited
    on two loads a group before its program read any noise: 33 groups' worth of memory
    latency at the head of every program."""
    g = tl.arange(0, GROUPS)
    slot, word = _neighbour_words(lora_ids, groups, words, header_words, g)
    before, word_before = _neighbour_words(lora_ids, groups, words, header_words, g - 1)
    after, word_after = _neighbour_words(lora_ids, groups, words, header_words, g + 1)
    live = slot >= 0
    starts = live & ((before < 0) | (word_before != word))
    ends = live & ((after < 0) | (word_after != word))
    n = tl.load(tokens_per_lora + g, mask=live, other=0)
    through = tl.cumsum(n, 0)
    # the run of group g began at the latest start at or before g; sums before it grow with g
    first_group = tl.associative_scan(tl.where(starts, g, -1), 0, _latest)
    run_tokens = through - tl.associative_scan(tl.where(starts, through - n, -1), 0, _latest)
    blocks = tl.where(ends, (run_tokens + BLOCK - 1) // BLOCK, 0)
    first = tl.cumsum(blocks, 0) - blocks
    hit = (t >= first) & (t < first + blocks)
    found = tl.max(tl.where(hit, first_group, -1), 0)
    row = tl.sum(tl.where(hit, (t - first) * BLOCK, 0), 0)
    rows = tl.sum(tl.where(hit, run_tokens, 0), 0)
    return found, row, rows


@triton.jit
def staged_inputs_kernel(
    x, staged, token_slots, words, K, x_stride, staged_stride, header_words,
    BLOCK: tl.constexpr,
):  # fmt: skip
    """staged[t, c] = x[t, c - shift_t] (zero outside x's row), shift_t the misalignment of
    token t's member's noise block in this layer (0 for a token without a member): the
    inputs as member_noise_kernel multiplies them with its aligned noise loads."""
    t = tl.program_id(0)
    columns = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    slot = tl.load(token_slots + t)
    offset = tl.load(words + slot * header_words, mask=slot >= 0, other=0)
    source = columns - (offset % ALIGN).to(tl.int32)
    values = tl.load(x + t * x_stride + source, mask=(source >= 0) & (source < K), other=0.0)
    tl.store(staged + t * staged_stride + columns, values, mask=columns < staged_stride)


@triton.jit
def _add_product(y, y_stride, tokens, live, columns, N, scales, acc):
    """y[tokens, columns] += scales * acc (a scale a token), in one rounding of y's fp32 value
    plus the product."""
    out = y + tokens[None, :] * y_stride + columns[:, None]
    mask = live[None, :] & (columns[:, None] < N)
    before = tl.load(out, mask=mask, other=0.0).to(tl.float32)
    total = before + scales[None, :] * acc
    tl.store(out, total.to(y.dtype.element_ty, fp_downcast_rounding="rtne"), mask=mask)


@triton.jit
def member_noise_kernel(
    staged, y, words, floats, token_slots, sorted_tokens, tokens_per_lora, token_start, lora_ids,
    groups, N, K, staged_stride, y_stride, header_words, header_floats,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUPS: tl.constexpr,
):  # fmt: skip
    """y[tokens of the tile, columns] += s * eps[columns, :] @ x[tokens]^T, s each token's
    member's scale and eps the tile's run's noise block.

    A member's block starts at any entry of the table, so the noise is read from the
    ALIGN-aligned entry at or before it, `shift` entries early: in whole 16-byte vectors,
    which Triton then streams asynchronously (unaligned, it loaded 2 bytes at a time, and the
    1.07B model's noise was read at about 1 TB/s of an H100's 3.35: docs/gpu.md). Loaded
    column j holds the noise of input j - shift, so the inputs come staged, shifted by their
    member's `shift` (staged_inputs_kernel); the window's extra columns meet zero inputs.
    Both loads of the loop are then whole aligned vectors, which Triton streams stages ahead
    of the products; read shifted here, the input loads were unaligned, which Triton does
    not stream, and every K step waited on one (the compiled sm_90 code). A pair's members
    share one input tile: one gather and one product a K step, the tile's columns theirs."""
    g, row, rows = _tile_run(
        tl.program_id(0), lora_ids, tokens_per_lora, groups, words, header_words, BLOCK_M, GROUPS
    )
    if g >= 0:
        block_rows = row + tl.arange(0, BLOCK_M)
        live = block_rows < rows
        tokens = tl.load(sorted_tokens + tl.load(token_start + g) + block_rows, mask=live, other=0)
        slots = tl.load(token_slots + tokens, mask=live, other=0)
        scales = tl.load(floats + slots * header_floats + 4, mask=live, other=0.0)
        live = live & (scales != 0.0)
        if tl.max(live.to(tl.int32), axis=0) > 0:
            slot = tl.load(lora_ids + g)
            offset = tl.load(words + slot * header_words)
            shift = (offset % ALIGN).to(tl.int32)
            address = tl.load(words + slot * header_words + 1)
            table = address.to(tl.pointer_type(staged.dtype.element_ty))
            block = tl.multiple_of(table, 16) + tl.multiple_of(offset - shift, ALIGN)
            columns = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
            acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
            for j0 in range(0, K + shift, BLOCK_K):
                js = j0 + tl.arange(0, BLOCK_K)
                eps = tl.load(
                    block + columns[:, None] * K + js[None, :],
                    mask=(columns[:, None] < N) & (js[None, :] < K + ALIGN),
                    other=0.0,
                )
                inputs = tl.load(
                    staged + tokens[None, :] * staged_stride + js[:, None],
                    mask=live[None, :] & (js[:, None] < K + ALIGN),
                    other=0.0,
                )
                acc = tl.dot(eps, inputs, acc)
            _add_product(y, y_stride, tokens, live, columns, N, scales, acc)


def stage_inputs(x: torch.Tensor, words: torch.Tensor, token_slots: torch.Tensor) -> torch.Tensor:
    """x [M, K] staged for member_noise_kernel (staged_inputs_kernel), `words` the layer's
    header words. A staged row holds the shifted inputs and the window's extra columns,
    rounded to 16 entries so that every row starts on a 32-byte boundary (and Triton, which
    specializes on arguments divisible by 16, knows it)."""
    m, k = x.shape
    staged = torch.empty((m, triton.cdiv(k + ALIGN.value, 16) * 16), dtype=x.dtype, device=x.device)
    staged_inputs_kernel[(m, triton.cdiv(staged.shape[1], STAGE_BLOCK))](
        x, staged, token_slots, words, k, x.stride(0), staged.stride(0), words.stride(0),
        BLOCK=STAGE_BLOCK,
    )  # fmt: skip
    return staged


def block_m(tokens: int, groups: int) -> int:
    """Tokens a program takes: more while members have many tokens each in the pass."""
    return PREFILL_BLOCK_M if tokens >= PREFILL_BLOCK_M * max(1, groups) else DECODE_BLOCK_M


def member_noise(
    y: torch.Tensor,
    x: torch.Tensor,
    headers: torch.Tensor,
    out_features: int,
    token_slots: torch.Tensor,
    sorted_tokens: torch.Tensor,
    tokens_per_lora: torch.Tensor,
    token_start: torch.Tensor,
    lora_ids: torch.Tensor,
    no_lora_flag_cpu: torch.Tensor,
    num_active_loras: torch.Tensor,
) -> None:
    """The kernel's launch, and the body of the op vLLM's graphs capture: x [M, K], y [M, >=
    out_features] (rows contiguous), `headers` a layer's lora_a_stacked[0]; the rest is
    vLLM's token mapping (LoRAKernelMeta.meta_args: each token's slot first), its two flags
    CPU tensors as in vLLM's LoRA ops (no wait on the GPU): no token has a member, and the
    groups holding tokens."""
    mapping = token_slots, sorted_tokens, tokens_per_lora, token_start, lora_ids
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
    """member_noise, vLLM's token mapping tensors in `mapping` (token slots, sorted tokens,
    tokens a group, group starts, group slots), with `tiles` overriding the launch's BLOCK_N,
    BLOCK_K, num_warps and num_stages: the kernel bench's search
    (bench/gpu/member_noise_kernel.py). The op keeps member_noise's signature, from which
    torch infers its schema."""
    from engine.backends.vllm.member_noise import header_views

    if bool(no_lora_flag_cpu.item()):
        return
    groups = int(num_active_loras.item())
    m, k = x.shape
    words, floats = header_views(headers)
    lora_ids = mapping[4]
    staged = stage_inputs(x, words, mapping[0])
    tile = block_m(m, groups)
    options = {"BLOCK_N": BLOCK_N, "BLOCK_K": BLOCK_K, **tiles}
    grid = (triton.cdiv(m, tile) + groups, triton.cdiv(out_features, options["BLOCK_N"]))
    member_noise_kernel[grid](
        staged, y, words, floats, *mapping, lora_ids.numel(), out_features, k,
        staged.stride(0), y.stride(0), words.stride(0), floats.stride(0), BLOCK_M=tile,
        GROUPS=triton.next_power_of_2(lora_ids.numel()), **options,
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
    torch.ops.vllm.eslab_member_noise_linear(
        y.view(-1, y.shape[-1]), x, headers, int(out_features), *meta
    )


def _member_noise_fake(*args: Any) -> None:
    """The op's shape function for torch.compile: it only writes y in place."""
