"""Linear weights stored packed (AMX CPUs), and how ES writes into them in the logical layout.

On a CPU with AMX, vLLM's CPU build multiplies bf16 linear layers with SGL's kernel, which
reads its weight pre-packed in a VNNI layout: blocks of `block` (32) logical rows, each
stored as [k / 2][block][2], so that logical entry (b * block + r, 2 j + t) lives at packed
[b, j, r, t]. cpu/weights.py keeps such weights live in that layout (checking, for every
shape, that the kernel packs exactly so).

A seed must draw the same perturbation on every CPU and GPU (docs/algorithms.md, "Noise"),
so the noise is always the logical tensor's: the worker keeps the fp32 master and the
snapshot of a packed weight in the logical layout, updates them there like any other, and
only the live tensor the kernel reads is packed:
- `write_live_` copies a logical tensor into the packed one (restore, after an update or a
  load), as a batched transpose of bf16 pairs (one 32-bit word each);
- `perturb_` writes pack(snapshot + scale * eps) in one pass, with the C kernel
  packed_perturb.c (built at first use, cpu/native.py), which rounds every entry exactly as
  engine.noise.perturb_ does in the logical layout; without a C compiler it computes that
  into a scratch tensor and packs it (the same bits, about twice the time).
The checksum of the engines hashes the logical layout too (`to_logical`), so engines of a
cluster agree whichever of them pack.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from engine import noise
from engine.backends.vllm.cpu import native

if TYPE_CHECKING:
    import torch

BLOCK_ROWS = 32
"""Logical rows in one packed block: SGL's bf16 VNNI layout (checked against its kernel)."""


class PackedLayout(NamedTuple):
    """An n x k weight stored in blocks of `block` rows, each as [k / 2][block][2]."""

    n: int
    k: int
    block: int = BLOCK_ROWS


def fits(n: int, k: int, block: int = BLOCK_ROWS) -> bool:
    """Whether an n x k weight splits into whole blocks of rows and pairs of columns."""
    return n > 0 and n % block == 0 and k > 0 and k % 2 == 0


def _packed_view(logical: torch.Tensor, layout: PackedLayout) -> torch.Tensor:
    """The logical tensor as a (n / block, k / 2, block, 2) view in packed order."""
    n, k, block = layout
    return logical.view(n // block, block, k // 2, 2).permute(0, 2, 1, 3)


def to_live(logical: torch.Tensor, layout: PackedLayout | None) -> torch.Tensor:
    """A new tensor in the live layout from one in the logical layout (any dtype)."""
    if layout is None:
        return logical.clone()
    live = logical.new_empty(layout.n, layout.k)
    write_live_(live, logical.contiguous(), layout)
    return live


def to_logical(live: torch.Tensor, layout: PackedLayout | None) -> torch.Tensor:
    """A new tensor in the logical layout from one in the live layout (any dtype)."""
    if layout is None:
        return live.clone()
    n, k, block = layout
    logical = live.new_empty(n, k)
    _packed_view(logical, layout).copy_(live.view(n // block, k // 2, block, 2))
    return logical


def write_live_(live: torch.Tensor, logical: torch.Tensor, layout: PackedLayout | None) -> None:
    """live := logical, packed where `layout` says so. For 2-byte dtypes each pair of
    columns moves as one 32-bit word: a batched transpose, 3x faster than moving entries."""
    if layout is None:
        live.copy_(logical)
        return
    import torch

    n, k, block = layout
    if live.element_size() == 2 and logical.is_contiguous():
        words = live.view(torch.int32).view(n // block, k // 2, block)
        words.copy_(logical.view(torch.int32).view(n // block, block, k // 2).transpose(1, 2))
        return
    live.view(n // block, k // 2, block, 2).copy_(_packed_view(logical.contiguous(), layout))


def noise_rows(segments: Sequence[noise.Segment], shape: Sequence[int]) -> torch.Tensor:
    """Where the noise of each logical row of a (shard of a) 2-D weight starts in its
    tensor's noise block: one int64 a row, for the C kernel. Every row's noise is one
    contiguous run: the segments of a tensor-parallel shard are whole rows of the whole
    tensor, or one column range of each of its rows (shards.py)."""
    import torch

    rows, width = int(shape[0]), int(shape[1])
    starts = torch.empty(rows, dtype=torch.int64)
    for s in segments:
        if s.rows == 1 and s.start % width == 0 and s.cols % width == 0:
            first, count, step = s.start // width, s.cols // width, width
        elif s.cols == width and s.start % width == 0:
            first, count, step = s.start // width, s.rows, s.stride
        else:
            raise ValueError(f"a noise segment {s} does not cover whole rows of {width}")
        starts[first : first + count] = s.skip + step * torch.arange(count, dtype=torch.int64)
    return starts


def perturb_(
    live: torch.Tensor,
    snapshot: torch.Tensor,
    table: torch.Tensor,
    offset: int,
    scale: float,
    segments: Sequence[noise.Segment],
    layout: PackedLayout,
    rows: torch.Tensor,
) -> None:
    """live := pack(snapshot + scale * eps), eps the logical tensor's noise at `offset` (see
    engine.noise.perturb_, whose numbers these are). `rows` is noise_rows(segments, ...)."""
    import torch

    n, k, block = layout
    function = _kernel()
    if function is not None and _kernel_takes(live, snapshot, table):
        failed = function(
            live.data_ptr(),
            snapshot.data_ptr(),
            table.data_ptr(),
            rows.data_ptr(),
            table.storage_offset() + offset,
            n,
            k,
            block,
            noise.rounded_scale(scale, live.dtype),
        )
        if failed:
            raise MemoryError("packed perturbation: no memory for the kernel's scratch tile")
        return
    logical = torch.empty_like(snapshot)
    noise.perturb_(logical, snapshot, table, offset, scale, segments)
    write_live_(live, logical, layout)


def _kernel_takes(live: torch.Tensor, snapshot: torch.Tensor, table: torch.Tensor) -> bool:
    import torch

    return (
        all(t.dtype == torch.bfloat16 and t.device.type == "cpu" for t in (live, snapshot, table))
        and live.is_contiguous()
        and snapshot.is_contiguous()
        and table.is_contiguous()
    )


SOURCE = Path(__file__).with_name("packed_perturb.c")
FLAGS = ("-O3", "-march=native", "-fopenmp", "-ffp-contract=off", "-shared", "-fPIC")
"""-ffp-contract=off: the product and the sum are rounded apart, as torch's kernel does."""


@functools.cache
def _kernel() -> Callable[..., int] | None:
    """The C perturbation of packed weights, or None where it cannot be built here."""
    library = native.library(SOURCE, FLAGS, "packed-weight perturbation")
    if library is None:
        return None
    function = library.eslab_perturb_packed
    function.restype = ctypes.c_int
    function.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 4 + [ctypes.c_float]
    return function
