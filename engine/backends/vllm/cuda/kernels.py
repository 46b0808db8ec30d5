"""Triton kernels that change all of a worker's weights in one launch.

Why: perturbing tensor by tensor from Python costs a launch and a few views per tensor (about
270 tensors for SmolLM2-135M), which took 4-8x one copy of all weights on an H200, and the
update added each member's noise to each tensor in its own pass over the fp32 master (32
passes, 35-90x one copy). Here a member's perturbation is one launch over a list of jobs,
and the update reads the master once, adds every member's noise in registers and writes
master, snapshot and serving weights once.

A job is one `engine.noise.Segment` of one tensor: entries [start, start + rows * cols) of
the tensor, viewed as rows x cols, take noise entries skip + i * stride + j of the tensor's
noise block. The grid is one program per tile of BLOCK entries of a job (`tile_job`,
`tile_first`); a job's tensors are reached through their addresses (int64 arrays: `live_of`,
`snap_of`, `master_of`), as Triton's grouped GEMM reaches its matrices. WHOLE (every job one
row, the tensor held whole) skips the row arithmetic; ALIGNED (WHOLE, every address 16-byte
aligned and every size a multiple of 8) lets the compiler use vector loads on the weights.
The noise block's start is an arbitrary table offset, so its loads are never aligned.

The arithmetic is the torch path's (engine.noise), entry for entry: the perturbation is
fma(eps, scale, w) in fp32 rounded once to the weights' dtype (torch.add(w, eps, alpha=s)),
and the update adds members in the given order, each as fma(eps, c, master) in fp32
(Tensor.add_(eps, alpha=c)); tests/unit/test_cuda_weights.py compares the bits on a GPU.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _tile(
    tile_job, tile_first, start_of, cols_of, stride_of, skip_of, numel_of,
    BLOCK: tl.constexpr, WHOLE: tl.constexpr, ALIGNED: tl.constexpr,
):  # fmt: skip
    """(job, positions in the tensor, positions in its noise block, mask) of this program."""
    t = tl.program_id(0)
    j = tl.load(tile_job + t)
    first = tl.multiple_of(tl.load(tile_first + t), BLOCK)
    n = tl.load(numel_of + j)
    if ALIGNED:
        n = tl.multiple_of(n, 8)
    idx = first + tl.arange(0, BLOCK)
    mask = idx < n
    if WHOLE:
        pos = idx
        noise_pos = idx
    else:
        cols = tl.load(cols_of + j)
        row = idx // cols
        pos = tl.load(start_of + j) + idx
        noise_pos = tl.load(skip_of + j) + row * tl.load(stride_of + j) + (idx - row * cols)
    return j, pos, noise_pos, mask


@triton.jit
def _address(addresses, j, DTYPE: tl.constexpr, ALIGNED: tl.constexpr):
    """Job j's tensor, from the int64 array of addresses."""
    address = tl.load(addresses + j)
    if ALIGNED:
        address = tl.multiple_of(address, 16)
    return address.to(tl.pointer_type(DTYPE))


@triton.jit
def _splat(value, BLOCK: tl.constexpr):
    """A scalar as a block (exactly: 0 + x is x), for fma, which older Tritons do not
    broadcast."""
    return tl.zeros((BLOCK,), dtype=tl.float32) + value


@triton.jit
def _serving(values, DTYPE: tl.constexpr):
    """fp32 -> the weights' dtype, to nearest even as torch casts (said, because Triton's
    interpreter truncates by default)."""
    if tl.float32 == DTYPE:
        return values
    return values.to(DTYPE, fp_downcast_rounding="rtne")


@triton.jit
def perturb(
    tile_job, tile_first, start_of, cols_of, stride_of, skip_of, numel_of, tensor_of,
    live_of, snap_of, offsets, table, scale,
    BLOCK: tl.constexpr, WHOLE: tl.constexpr, ALIGNED: tl.constexpr, DTYPE: tl.constexpr,
):  # fmt: skip
    """live := snapshot + scale * eps, where eps of tensor i starts at table[offsets[i]]."""
    j, pos, noise_pos, mask = _tile(
        tile_job, tile_first, start_of, cols_of, stride_of, skip_of, numel_of,
        BLOCK, WHOLE, ALIGNED,
    )  # fmt: skip
    base = tl.load(offsets + tl.load(tensor_of + j))
    eps = tl.load(table + base + noise_pos, mask=mask).to(tl.float32)
    w = tl.load(_address(snap_of, j, DTYPE, ALIGNED) + pos, mask=mask).to(tl.float32)
    perturbed = _serving(tl.fma(eps, _splat(scale, BLOCK), w), DTYPE)
    tl.store(_address(live_of, j, DTYPE, ALIGNED) + pos, perturbed, mask=mask)


@triton.jit
def copy(
    tile_job, tile_first, start_of, cols_of, stride_of, skip_of, numel_of,
    dst_of, src_of,
    BLOCK: tl.constexpr, WHOLE: tl.constexpr, ALIGNED: tl.constexpr, DTYPE: tl.constexpr,
):  # fmt: skip
    """dst := src for every job (the restore: live := snapshot)."""
    j, pos, _, mask = _tile(
        tile_job, tile_first, start_of, cols_of, stride_of, skip_of, numel_of,
        BLOCK, WHOLE, ALIGNED,
    )  # fmt: skip
    values = tl.load(_address(src_of, j, DTYPE, ALIGNED) + pos, mask=mask)
    tl.store(_address(dst_of, j, DTYPE, ALIGNED) + pos, values, mask=mask)


@triton.jit
def update(
    tile_job, tile_first, start_of, cols_of, stride_of, skip_of, numel_of, tensor_of,
    master_of, snap_of, live_of, offsets, coefficients, members, tensors, table, sums,
    BLOCK: tl.constexpr, WHOLE: tl.constexpr, ALIGNED: tl.constexpr, DTYPE: tl.constexpr,
    APPLY: tl.constexpr,
):  # fmt: skip
    """master += sum_k coefficients[k] * eps_k, members in order, then snapshot and live :=
    cast(master); offsets is members x tensors. Without APPLY only the noise is read and each
    program's sum stored in `sums`: the floor the update is measured against."""
    j, pos, noise_pos, mask = _tile(
        tile_job, tile_first, start_of, cols_of, stride_of, skip_of, numel_of,
        BLOCK, WHOLE, ALIGNED,
    )  # fmt: skip
    tensor = tl.load(tensor_of + j)
    master = _address(master_of, j, tl.float32, ALIGNED) + pos
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    if APPLY:
        acc = tl.load(master, mask=mask)
    for k in range(members):
        c = tl.load(coefficients + k)
        base = tl.load(offsets + k * tensors + tensor)
        eps = tl.load(table + base + noise_pos, mask=mask).to(tl.float32)
        acc = tl.fma(eps, _splat(c, BLOCK), acc)
    if APPLY:
        tl.store(master, acc, mask=mask)
        served = _serving(acc, DTYPE)
        tl.store(_address(snap_of, j, DTYPE, ALIGNED) + pos, served, mask=mask)
        tl.store(_address(live_of, j, DTYPE, ALIGNED) + pos, served, mask=mask)
    else:
        tl.store(sums + tl.program_id(0), tl.sum(tl.where(mask, acc, 0.0)))


@triton.jit
def _multiplier(key):
    """A pseudo-random odd int64 for position key (a splitmix-style mix; wraps mod 2^64)."""
    x = key * 0x5851F42D4C957F2D + 0x14057B7EF767814F
    x = x ^ (x >> 29)
    x = x * 0x27BB2EE687B0B0FD
    x = x ^ (x >> 32)
    return x | 1


@triton.jit
def fingerprint(
    tile_job, tile_first, start_of, cols_of, stride_of, skip_of, numel_of, tensor_of,
    live_of, master_of, sums,
    BLOCK: tl.constexpr, WHOLE: tl.constexpr, ALIGNED: tl.constexpr, DTYPE: tl.constexpr,
    WORD: tl.constexpr,
):  # fmt: skip
    """Each program's part of sum(word * multiplier(tensor, kind, position)) mod 2^64 over
    the serving weights' and the masters' words: an order-free universal hash (see
    engine/backends/vllm/fingerprint.py for why this kind)."""
    j, pos, _, mask = _tile(
        tile_job, tile_first, start_of, cols_of, stride_of, skip_of, numel_of,
        BLOCK, WHOLE, ALIGNED,
    )  # fmt: skip
    live = tl.load(_address(live_of, j, DTYPE, ALIGNED) + pos, mask=mask, other=0.0)
    master = tl.load(_address(master_of, j, tl.float32, ALIGNED) + pos, mask=mask, other=0.0)
    key = tl.load(tensor_of + j) * (1 << 41) + pos * 2
    hashed = live.to(WORD, bitcast=True).to(tl.int64) * _multiplier(key)
    hashed += master.to(tl.int32, bitcast=True).to(tl.int64) * _multiplier(key + 1)
    tl.store(sums + tl.program_id(0), tl.sum(tl.where(mask, hashed, 0)))
