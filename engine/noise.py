"""Seeds and seeded noise for ES perturbations.

One seed gives one perturbation, the same on every engine and every time (docs/design.md,
"Engine rules"). Seeds are derived by hashing, as nlp-waseda/lbes does (`derive_seed`), so a
member's seed depends only on (run seed, step, member) and never on the order engines ran in.

Noise comes from a shared noise table (OpenAI ES, Salimans et al. 2017, arXiv 1703.03864):
each engine builds, once, a table of standard normals from a fixed table seed, on the device
that holds the weights, and the noise of one tensor for one member is a contiguous slice of
it, at an offset hashed from (member seed, tensor key):

    eps(seed, key) = table[offset(seed, key) : offset(seed, key) + numel].view(shape)

Why a table and not fresh normals per member: on the CPU, drawing 135M normals costs about
0.8 s (the generator is the bottleneck, not memory), while a member's whole perturbation
`weights := snapshot + scale * eps` from the table costs 1.6 to 2 plain copies of the weights
(about 50-60 ms for SmolLM2-135M on 2 cores: 3 memory streams against a copy's 2). On a
GPU the generator is fast enough either way, and the table keeps one code path and gives the
same noise on every device: it is drawn on the CPU in fixed chunks from fixed seeds and then
moved, so the table is bit-identical everywhere.

The trade-off, stated plainly:
- Per tensor, the noise is a block of i.i.d. normals, and no two tensors of one member get the
  same offset (`noise_offsets` enforces it), so entries at the same position of two tensors
  are always different table entries: same-shaped tensors never share noise (the bug of the
  ES-at-Scale reference, which reseeds every tensor with the same seed).
- Blocks of different tensors or members may overlap at a shift (the table is smaller than
  the model), so eps of tensor A can equal a shifted part of eps of tensor B. Shifted copies
  are uncorrelated position by position; Salimans et al. use one 250M-entry table for all
  workers for the same reason. Two members get identical noise on a tensor only if their
  offsets collide, with probability 1 / (table_len - numel) per tensor pair.
- The table is stored in the serving dtype (bf16 by default): the noise values are normals
  rounded to bf16. Perturb, restore and update all read these same values, so the estimator
  stays consistent; storing fp32 doubles the table and makes the bf16 perturbation a slow
  mixed-dtype kernel on the CPU (measured 310 ms against 48 ms for the 135M model).
- Memory: one table per engine (on each of its tensor-parallel ranks), max(2**26, 2 *
  largest whole tensor) entries, the same at every size (128 MiB in bf16 for SmolLM2-135M;
  2 GiB for an 8B model with a 128k vocabulary). On the CPU the worker also
  keeps the same values in fp32 (256 MiB) for the fp32 update, whose same-dtype add is
  fast and steady where the mixed-dtype one is not.

Layouts: the noise is the logical tensor's everywhere. On AMX CPUs the live linear weights
are packed for vLLM's kernel, and engine/backends/vllm/cpu/packed.py writes the logical
perturbation into them (the same bits as perturb_ below), so a seed means the same
perturbation on every CPU and GPU.

Tensor keys: the parameter's name and its whole size, as tensor_parallel_size 1 holds it. A
tensor's noise block is indexed by the position of each entry in the whole (unsharded)
tensor, so with tensor_parallel_size k each rank perturbs and updates its shard with
exactly the block entries of the positions it holds (`Segment`s: contiguous row ranges,
or a strided column range for a RowParallelLinear weight; which ones, from vLLM's sharding,
in engine/backends/vllm/shards.py). Every size draws the same perturbation and applies the
same update, bit for bit on the CPU (perturb_ rounds every entry alike, see there), and a
run may resume at another size, packed or not.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    import torch

SEED_BITS = 31

NOISE_TABLE_SEED = 17_030_386
"""Seed of the noise table (arXiv 1703.03864). Fixed: changing it changes every perturbation."""

MIN_TABLE_LEN = 2**26
"""Smallest table: 64M entries. Large enough that offsets of a model's tensors rarely overlap
much, small enough (128 MiB in bf16) to build in about half a second on one CPU core."""

TABLE_CHUNK = 2**22
"""The table is drawn in chunks of this many entries, chunk k from its own seed, so building
it needs little host memory and the result does not depend on the device or the chunking of
the copy."""

TABLE_SLACK = 8
"""Entries an engine keeps after its table (the longer table's own values), which kernels
that read noise blocks in aligned 16-byte vectors may touch past a block that ends where the
table does (engine/backends/vllm/cuda/member_noise.py); offsets never reach them."""

UPDATE_CHUNK = 2**16
"""On the CPU the update converts bf16 noise to fp32 in blocks of this many entries, so the
block and the master block it is added to stay in cache across members (measured fastest
among 64K/256K/1M on this machine)."""


MAX_OFFSET_ATTEMPTS = 10_000


def derive_seed(base: int, *parts: int | str) -> int:
    """Hash `base` and `parts` into a non-negative 31-bit seed (the lbes `derive_seed` rule)."""
    key = "_".join(str(p) for p in (base, *parts))
    digest = hashlib.sha256(key.encode()).digest()
    return int.from_bytes(digest[:4], "big") % (2**SEED_BITS)


def member_seed(run_seed: int, step: int, member: int) -> int:
    """The seed of population member `member` at training step `step`."""
    return derive_seed(run_seed, step, member)


def noise_table_len(max_numel: int, min_len: int = MIN_TABLE_LEN) -> int:
    """Table length for a model whose largest tensor has `max_numel` entries: at least twice
    that, so the largest tensor still has as many possible offsets as it has entries."""
    if max_numel <= 0:
        raise ValueError(f"max_numel must be positive, got {max_numel}")
    return max(min_len, 2 * max_numel)


def build_noise_table(
    length: int,
    *,
    seed: int = NOISE_TABLE_SEED,
    dtype: torch.dtype | None = None,
    device: str | torch.device = "cpu",
) -> torch.Tensor:
    """A table of `length` standard normals in `dtype` (default bf16) on `device`.

    Chunk k is drawn in fp32 on the CPU from `derive_seed(seed, "table", k)`, then rounded
    to `dtype` and copied into place, so the table is the same on every device and machine,
    and a shorter table is a prefix of a longer one.
    """
    import torch

    if length <= 0:
        raise ValueError(f"noise table length must be positive, got {length}")
    dtype = dtype or torch.bfloat16
    table = torch.empty(length, dtype=dtype, device=device)
    generator = torch.Generator(device="cpu")
    for k, start in enumerate(range(0, length, TABLE_CHUNK)):
        stop = min(length, start + TABLE_CHUNK)
        generator.manual_seed(derive_seed(seed, "table", k))
        # always a whole chunk: torch's randn(m) is not a prefix of randn(n) for m < n
        chunk = torch.randn(TABLE_CHUNK, generator=generator, dtype=torch.float32)
        table[start:stop].copy_(chunk[: stop - start])
    return table


@functools.lru_cache(maxsize=1)
def shared_noise_table(length: int, seed: int, dtype: str) -> torch.Tensor:
    """build_noise_table on the CPU, once per process for the same (length, seed, dtype):
    a copy of an engine's table (VLLMEngine.noise_table says which) in another process, so
    it draws what the engine's workers draw; `dtype` as str(torch dtype), "torch.bfloat16"."""
    import torch

    return build_noise_table(length, seed=seed, dtype=getattr(torch, dtype.removeprefix("torch.")))


def noise_offset(seed: int, key: str, numel: int, table_len: int, attempt: int = 0) -> int:
    """Start of the noise block of tensor `key` (with `numel` entries) for member `seed`."""
    if not 0 < numel <= table_len:
        raise ValueError(
            f"tensor {key!r} has {numel} entries; the noise table has {table_len}: "
            "build the table with noise_table_len(largest numel)"
        )
    return _hashed(f"{seed}_{key}_{attempt}".encode(), table_len - numel + 1)


def noise_offsets(seed: int, tensors: Sequence[tuple[str, int]], table_len: int) -> list[int]:
    """Offsets of all `(key, numel)` tensors of one member, pairwise distinct.

    Keys are visited in sorted order and an offset already taken is rehashed with the next
    attempt number, so the result depends only on the seed and the set of tensors (never on
    the order a backend lists them) and no two tensors of a member share noise position by
    position. Every offset is `noise_offset`'s; the order, the keys' bytes and the checks
    are worked out once per model (`_offset_plan`), since an update hashes the offsets of
    every member for every tensor (6,000 hashes for 32 members of SmolLM2-135M).
    """
    order, suffixes, moduli = _offset_plan(tuple((k, n) for k, n in tensors), table_len)
    prefix = f"{seed}_".encode()
    taken: set[int] = set()
    offsets = [0] * len(order)
    for i in order:
        offset = _hashed(prefix + suffixes[i], moduli[i])
        attempt = 0
        while offset in taken:
            attempt += 1
            if attempt > MAX_OFFSET_ATTEMPTS:
                raise ValueError(
                    f"no free noise offset for {tensors[i][0]!r} after {attempt} attempts: "
                    f"{len(tensors)} tensors in a table of {table_len}; use a longer table"
                )
            key, numel = tensors[i]
            offset = noise_offset(seed, key, numel, table_len, attempt)
        taken.add(offset)
        offsets[i] = offset
    return offsets


@functools.lru_cache(maxsize=8)
def _offset_plan(
    tensors: tuple[tuple[str, int], ...], table_len: int
) -> tuple[list[int], list[bytes], list[int]]:
    """(keys' sorted order, each key's hashed suffix `{key}_0`, each offset's modulus), with
    noise_offset's checks of every size."""
    for key, numel in tensors:
        noise_offset(0, key, numel, table_len)
    order = sorted(range(len(tensors)), key=lambda i: tensors[i][0])
    suffixes = [f"{key}_0".encode() for key, _ in tensors]
    return order, suffixes, [table_len - numel + 1 for _, numel in tensors]


def _hashed(message: bytes, modulus: int) -> int:
    return int.from_bytes(hashlib.sha256(message).digest()[:8], "big") % modulus


class Segment(NamedTuple):
    """A piece of a tensor and the noise it takes: entries [start, start + rows * cols) of
    the tensor (flat), viewed as rows x cols, take the noise entries at `skip + i * stride + j`
    of the tensor's noise block. A tensor held whole is one segment of one row; a
    tensor-parallel shard is one segment per piece of the whole tensor it holds
    (engine/backends/vllm/shards.py)."""

    start: int
    rows: int
    cols: int
    skip: int
    stride: int


def whole(numel: int) -> tuple[Segment]:
    """The one segment of a tensor held whole."""
    return (Segment(0, 1, numel, 0, numel),)


def noise_view(table: torch.Tensor, offset: int, segment: Segment) -> torch.Tensor:
    """The noise of `segment` in the block at `offset`: a (rows, cols) view of the table,
    strided where the segment is a column range of the whole tensor (no copy)."""
    return table.as_strided(
        (segment.rows, segment.cols),
        (segment.stride, 1),
        table.storage_offset() + offset + segment.skip,
    )


def _part(tensor: torch.Tensor, segment: Segment) -> torch.Tensor:
    """The entries of a (contiguous) tensor that `segment` covers, as rows x cols (one view
    op: this runs once per tensor and member)."""
    return tensor.as_strided(
        (segment.rows, segment.cols), (segment.cols, 1), tensor.storage_offset() + segment.start
    )


def perturb_(
    out: torch.Tensor,
    snapshot: torch.Tensor,
    table: torch.Tensor,
    offset: int,
    scale: float,
    segments: Sequence[Segment] | None = None,
) -> None:
    """out := snapshot + scale * eps, in one pass and one rounding per entry.

    Computed from the snapshot, never added to the current weights, so a perturbation
    overwrites the previous one and nothing accumulates (in bf16, add-then-subtract leaves
    7.5% of the weights one rounding step off per cycle). `segments` (default: the tensor
    whole) say where its noise lies in the block at `offset`.

    Every entry gets the same arithmetic wherever it lies, so a shard computes exactly the
    entries the whole tensor would. On the CPU in bf16 or fp16 that takes `addcmul` with the
    scale rounded to the weights' dtype: `torch.add(alpha=)` computes
    fp32(w) + alpha * fp32(eps) with alpha so rounded in its vector loop, but rounds
    alpha * eps to bf16 in its scalar loop, which runs on the last entries of every thread's
    chunk and on the rows of a strided view, so its bits depended on the thread count and on
    where a piece starts (measured: about 1 entry in 2,000 of those). addcmul computes every
    entry in fp32 with that same alpha, the vector loop's numbers. On GPUs add's vector and
    scalar loops share one fp32 function and the scale is kept as given.
    """
    import torch

    cpu_half = out.device.type == "cpu" and out.dtype in (torch.bfloat16, torch.float16)
    rounded = rounded_scale(scale, out.dtype) if cpu_half else scale
    for segment in segments or whole(out.numel()):
        target, base = _part(out, segment), _part(snapshot, segment)
        eps = noise_view(table, offset, segment)
        if cpu_half:
            torch.addcmul(base, eps, _one(out.dtype), value=rounded, out=target)
        else:
            torch.add(base, eps, alpha=scale, out=target)


@functools.lru_cache(maxsize=4)
def _one(dtype: torch.dtype) -> torch.Tensor:
    import torch

    return torch.ones((), dtype=dtype)


@functools.lru_cache(maxsize=64)
def rounded_scale(scale: float, dtype: torch.dtype) -> float:
    """`scale` rounded to `dtype`, as perturb_ multiplies the noise by on the CPU (cached:
    every tensor of a member has the same scale)."""
    import torch

    return float(torch.tensor(scale, dtype=dtype))


def accumulate_(
    master: torch.Tensor,
    table: torch.Tensor,
    offsets: Sequence[int],
    coefficients: Sequence[float],
    scratch: torch.Tensor | None = None,
    segments: Sequence[Segment] | None = None,
) -> None:
    """master += sum_i coefficients[i] * eps_i in fp32, members added in the given order.

    A coefficient of exactly 0 is skipped, not added as 0 * eps: -0.0 + 0.0 is +0.0, and the
    weights must stay bit-identical under an all-zero update. On the CPU, bf16 noise is
    converted to fp32 block by block into `scratch` (a plain fp32 add is about 2x faster than
    the mixed-dtype kernel); on other devices, or with an fp32 table, the add reads the table
    directly. Both give the same numbers: every term is fp32(master) + fp32(c) * fp32(eps),
    in one fused rounding whatever loop of the kernel computes it, so a shard's entries get
    exactly the bits of the whole tensor's. `segments` as in perturb_.
    """
    import torch

    if len(offsets) != len(coefficients):
        raise ValueError(f"{len(offsets)} offsets but {len(coefficients)} coefficients")
    terms = [(o, float(c)) for o, c in zip(offsets, coefficients, strict=True) if c != 0.0]
    if not terms:
        return
    segments = segments or whole(master.numel())
    if master.device.type != "cpu" or table.dtype == master.dtype:
        for segment in segments:
            target = _part(master, segment)
            for offset, c in terms:
                target.add_(noise_view(table, offset, segment), alpha=c)
        return
    if scratch is None or scratch.numel() < UPDATE_CHUNK:
        scratch = torch.empty(UPDATE_CHUNK, dtype=master.dtype)
    for segment in segments:
        target = _part(master, segment)
        for rows, cols in _blocks(segment.rows, segment.cols):
            block = scratch[: (rows.stop - rows.start) * (cols.stop - cols.start)]
            block = block.view(rows.stop - rows.start, cols.stop - cols.start)
            for offset, c in terms:
                block.copy_(noise_view(table, offset, segment)[rows, cols])
                target[rows, cols].add_(block, alpha=c)


def _blocks(rows: int, cols: int) -> Iterator[tuple[slice, slice]]:
    """(rows, columns) blocks of at most UPDATE_CHUNK entries covering a rows x cols grid:
    whole rows where a row fits, else pieces of one row."""
    if cols >= UPDATE_CHUNK:
        for row in range(rows):
            for start in range(0, cols, UPDATE_CHUNK):
                yield slice(row, row + 1), slice(start, min(cols, start + UPDATE_CHUNK))
        return
    step = UPDATE_CHUNK // cols
    for start in range(0, rows, step):
        yield slice(start, min(rows, start + step)), slice(0, cols)
