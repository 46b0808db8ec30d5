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
- Memory: one table per engine, max(2**26, 2 * largest tensor) entries (128 MiB in bf16 for
  SmolLM2-135M; 2 GiB for an 8B model with a 128k vocabulary). On the CPU the worker also
  keeps the same values in fp32 (256 MiB) for the fp32 update, whose same-dtype add is
  fast and steady where the mixed-dtype one is not.

Layouts: the noise applies to the tensors the model computes with. On AMX CPUs vLLM's linear
weights are kept in a packed layout (engine/backends/vllm/cpu/weights.py), so the same
slice lands on a permuted set of logical entries there: a seed means the same perturbation
on every engine of one machine type, not across CPU and GPU engines.

Tensor keys: the parameter name, plus the tensor-parallel rank and size when the size is
above 1, so each rank perturbs its own shard independently. Noise with tensor_parallel_size
> 1 therefore differs from noise with size 1 (and a run cannot change its TP size midway).
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Sequence
from typing import TYPE_CHECKING

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


def noise_key(name: str, tp_rank: int = 0, tp_size: int = 1) -> str:
    """The identity of a tensor for noise purposes: its name, and its shard when sharded."""
    return name if tp_size == 1 else f"{name}@tp{tp_rank}/{tp_size}"


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
    digest = hashlib.sha256(f"{seed}_{key}_{attempt}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % (table_len - numel + 1)


def noise_offsets(seed: int, tensors: Sequence[tuple[str, int]], table_len: int) -> list[int]:
    """Offsets of all `(key, numel)` tensors of one member, pairwise distinct.

    Keys are visited in sorted order and an offset already taken is rehashed with the next
    attempt number, so the result depends only on the seed and the set of tensors (never on
    the order a backend lists them) and no two tensors of a member share noise position by
    position.
    """
    order = sorted(range(len(tensors)), key=lambda i: tensors[i][0])
    taken: set[int] = set()
    offsets = [0] * len(tensors)
    for i in order:
        key, numel = tensors[i]
        attempt = 0
        offset = noise_offset(seed, key, numel, table_len)
        while offset in taken:
            attempt += 1
            if attempt > MAX_OFFSET_ATTEMPTS:
                raise ValueError(
                    f"no free noise offset for {key!r} after {attempt} attempts: "
                    f"{len(tensors)} tensors in a table of {table_len}; use a longer table"
                )
            offset = noise_offset(seed, key, numel, table_len, attempt)
        taken.add(offset)
        offsets[i] = offset
    return offsets


def noise_block(table: torch.Tensor, offset: int, like: torch.Tensor) -> torch.Tensor:
    """The noise block at `offset`, viewed with the shape of `like` (no copy)."""
    return table[offset : offset + like.numel()].view(like.shape)


def perturb_(
    out: torch.Tensor, snapshot: torch.Tensor, table: torch.Tensor, offset: int, scale: float
) -> None:
    """out := snapshot + scale * eps, in one pass and one rounding.

    Computed from the snapshot, never added to the current weights, so a perturbation
    overwrites the previous one and nothing accumulates (in bf16, add-then-subtract leaves
    7.5% of the weights one rounding step off per cycle).
    """
    import torch

    n = out.numel()
    torch.add(snapshot.view(-1), table[offset : offset + n], alpha=scale, out=out.view(-1))


def accumulate_(
    master: torch.Tensor,
    table: torch.Tensor,
    offsets: Sequence[int],
    coefficients: Sequence[float],
    scratch: torch.Tensor | None = None,
) -> None:
    """master += sum_i coefficients[i] * eps_i in fp32, members added in the given order.

    A coefficient of exactly 0 is skipped, not added as 0 * eps: -0.0 + 0.0 is +0.0, and the
    weights must stay bit-identical under an all-zero update. On the CPU, bf16 noise is
    converted to fp32 block by block into `scratch` (a plain fp32 add is about 2x faster than
    the mixed-dtype kernel); on other devices the mixed-dtype add is used directly. Both give
    the same numbers: every term is fp32(master) + fp32(c) * fp32(eps).
    """
    import torch

    if len(offsets) != len(coefficients):
        raise ValueError(f"{len(offsets)} offsets but {len(coefficients)} coefficients")
    terms = [(o, float(c)) for o, c in zip(offsets, coefficients, strict=True) if c != 0.0]
    if not terms:
        return
    flat = master.view(-1)
    n = flat.numel()
    same_dtype = table.dtype == master.dtype
    if master.device.type != "cpu" or same_dtype:
        for offset, c in terms:
            flat.add_(table[offset : offset + n], alpha=c)
        return
    if scratch is None or scratch.numel() < min(n, UPDATE_CHUNK):
        scratch = torch.empty(min(n, UPDATE_CHUNK), dtype=master.dtype)
    for start in range(0, n, UPDATE_CHUNK):
        stop = min(n, start + UPDATE_CHUNK)
        block = scratch[: stop - start]
        target = flat[start:stop]
        for offset, c in terms:
            block.copy_(table[offset + start : offset + stop])
            target.add_(block, alpha=c)
