"""Checks of the multi-LoRA linear kernels (engine/backends/vllm/cuda/lora_kernels.py), run by
tests/unit/test_cuda_lora_kernels.py: against the same product in float64, within the
rounding the kernels do (the adapters' dtype for the shrink's result, the output's for the
sum; Triton's interpreter rounds toward zero where the GPU rounds to nearest, so twice that
there), bit for bit where no adapter applies, and the same bits on every launch; on a GPU
also against vLLM's own shrink and expand kernels.

The metadata is built as vLLM's LoRAKernelMeta.prepare_tensors builds it: tokens sorted by
adapter slot (stable), the slots in use in ascending order with -1 (no adapter) first where
present, padded with -1 to max_loras + 1 entries.
"""

from __future__ import annotations

import torch

from engine.backends.vllm.cuda import lora_hooks, lora_kernels
from tests.unit import triton_checks

ON_GPU = torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"
RANK = 8  # the slots' rank (vLLM's max_lora_rank); the adapters fill the first USED rows
USED = 4
SCALE = 0.5
ROUNDING = 2.0**-8 if ON_GPU else 2.0**-7


def _meta(mapping: list[int], max_loras: int) -> tuple[torch.Tensor, ...]:
    tokens = torch.tensor(mapping, dtype=torch.int32)
    _, order = torch.sort(tokens, stable=True)
    ids, counts = torch.unique(tokens, sorted=True, return_counts=True)
    lora_ids = torch.full((max_loras + 1,), -1, dtype=torch.int32)
    lora_ids[: ids.numel()] = ids
    per_lora = torch.zeros(max_loras + 1, dtype=torch.int32)
    per_lora[: counts.numel()] = counts
    start = torch.zeros(max_loras + 2, dtype=torch.int32)
    start[1 : 1 + counts.numel()] = torch.cumsum(counts, 0)
    return tuple(t.to(DEVICE) for t in (order.to(torch.int32), per_lora, start, lora_ids))


def _layer(tokens: int, hidden: int, widths: list[int], loras: int, seed: int = 0):
    """x, A, B, y of a fused layer with a slice per width; adapters of rank USED in slots of
    RANK rows, as vLLM pads them."""
    generator = torch.Generator().manual_seed(seed)

    def normal(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator).to(torch.bfloat16)

    lora_a = [torch.zeros(loras, 1, RANK, hidden, dtype=torch.bfloat16) for _ in widths]
    lora_b = [torch.zeros(loras, 1, n, RANK, dtype=torch.bfloat16) for n in widths]
    for a, b in zip(lora_a, lora_b, strict=True):
        a[:, :, :USED] = normal(loras, 1, USED, hidden)
        b[..., :USED] = normal(*b.shape[:-1], USED)
    x, y = normal(tokens, hidden), normal(tokens, sum(widths))
    move = [t.to(DEVICE) for t in (x, y, *lora_a, *lora_b)]
    return move[0], move[2 : 2 + len(widths)], move[2 + len(widths) :], move[1]


def _run(y, x, lora_a, lora_b, widths, mapping, loras, add_inputs=True):
    out = y.clone()
    sorted_tokens, per_lora, start, lora_ids = _meta(mapping, loras)
    groups = len(set(mapping))
    lora_kernels.lora_linear(
        out, x, lora_a, lora_b, SCALE, widths, add_inputs, sorted_tokens, per_lora, start,
        lora_ids, groups,
    )  # fmt: skip
    return out


def _expected(y, x, lora_a, lora_b, widths, mapping, add_inputs=True):
    """(float64 result, the bound of the kernels' rounding) of every entry."""
    y64 = y.double().cpu() if add_inputs else torch.zeros(y.shape, dtype=torch.float64)
    bound = ROUNDING * y64.abs()
    first = 0
    for a, b, n in zip(lora_a, lora_b, widths, strict=True):
        for t, slot in enumerate(mapping):
            if slot < 0:
                continue
            shrunk = x[t].double().cpu() @ a[slot, 0].double().cpu().T * SCALE
            b64 = b[slot, 0].double().cpu()
            term = shrunk @ b64.T
            y64[t, first : first + n] += term
            bound[t, first : first + n] += ROUNDING * (
                2 * (shrunk.abs() @ b64.abs().T) + term.abs()
            )
        first += n
    return y64, bound + 1e-6


def _assert_close(out, expected, bound):
    error = (out.double().cpu() - expected).abs()
    worst = (error - bound).max()
    assert worst <= 0, f"off by {float(error.max()):.4g} where the rounding allows {worst:.4g} less"


MAPPING = [3, -1, 0, 0, 3, 1, -1, 4, 0, 2, 2, 3] * 3 + [1]  # 37 tokens, 5 slots and none


def check_a_fused_layer_adds_each_slices_product_to_its_columns():
    widths = [40, 24, 24]  # q, k, v: k and v start after q
    x, lora_a, lora_b, y = _layer(len(MAPPING), 600, widths, 5)  # 600: two K splits, a tail
    out = _run(y, x, lora_a, lora_b, widths, MAPPING, 5)
    _assert_close(out, *_expected(y, x, lora_a, lora_b, widths, MAPPING))


def check_one_slice_wider_than_a_block_without_adding_the_input():
    widths = [130]  # past one BLOCK_N of columns
    x, lora_a, lora_b, y = _layer(len(MAPPING), 1100, widths, 5, seed=1)  # three splits
    out = _run(y, x, lora_a, lora_b, widths, MAPPING, 5, add_inputs=False)
    mine = [t for t, slot in enumerate(MAPPING) if slot >= 0]
    expected, bound = _expected(y, x, lora_a, lora_b, widths, MAPPING, add_inputs=False)
    _assert_close(out[mine], expected[mine], bound[mine])


def check_tokens_without_an_adapter_keep_their_bits():
    widths = [40, 24, 24]
    x, lora_a, lora_b, y = _layer(len(MAPPING), 600, widths, 5)
    out = _run(y, x, lora_a, lora_b, widths, MAPPING, 5)
    plain = [t for t, slot in enumerate(MAPPING) if slot < 0]
    assert torch.equal(out[plain], y[plain])


def check_a_batch_with_no_adapter_changes_nothing():
    widths = [64]
    mapping = [-1] * 20
    x, lora_a, lora_b, y = _layer(len(mapping), 256, widths, 3)
    assert torch.equal(_run(y, x, lora_a, lora_b, widths, mapping, 3), y)


def check_many_tokens_of_one_adapter_span_several_blocks():
    widths = [48]
    mapping = [1] * 50 + [0] * 3  # 50 tokens of slot 1: four blocks of BLOCK_M
    x, lora_a, lora_b, y = _layer(len(mapping), 300, widths, 2, seed=2)
    out = _run(y, x, lora_a, lora_b, widths, mapping, 2)
    _assert_close(out, *_expected(y, x, lora_a, lora_b, widths, mapping))


def check_every_launch_gives_the_same_bits():
    widths = [40, 24, 24]
    x, lora_a, lora_b, y = _layer(len(MAPPING), 600, widths, 5)
    first = _run(y, x, lora_a, lora_b, widths, MAPPING, 5)
    assert torch.equal(first, _run(y, x, lora_a, lora_b, widths, MAPPING, 5))


def check_against_vllms_own_kernels_on_a_gpu():
    if not ON_GPU:
        return
    from vllm.lora.ops.triton_ops import lora_expand, lora_shrink

    widths = [40, 24, 24]
    x, lora_a, lora_b, y = _layer(len(MAPPING), 600, widths, 5)
    sorted_tokens, per_lora, start, lora_ids = _meta(MAPPING, 5)
    mapping = torch.tensor(MAPPING, dtype=torch.int32, device=DEVICE)
    meta = (mapping, sorted_tokens, per_lora, start, lora_ids)
    flags = (torch.tensor([False]), torch.tensor([6], dtype=torch.int32))
    buffer = torch.empty((len(widths), x.size(0), RANK), dtype=torch.float32, device=DEVICE)
    theirs = y.clone()
    lora_shrink(x, lora_a, buffer, *meta, *flags, SCALE)
    lora_expand(buffer, lora_b, theirs, *meta, *flags, offset_start=0, add_inputs=True)
    ours = _run(y, x, lora_a, lora_b, widths, MAPPING, 5)
    _assert_close(ours, theirs.double().cpu(), 2 * ROUNDING * theirs.double().abs().cpu() + 0.05)


def check_the_punica_hook_serves_vllms_metadata():
    """lora_hooks.add_lora_linear as vLLM's layers call it, on the metadata vLLM's own
    LoRAKernelMeta prepares for the batch (the ops' argument order, the flags)."""
    from types import SimpleNamespace

    from vllm.lora.ops.triton_ops.lora_kernel_metadata import LoRAKernelMeta

    lora_hooks.register_op()
    widths = [40, 24, 24]
    x, lora_a, lora_b, y = _layer(len(MAPPING), 600, widths, 5)
    meta = LoRAKernelMeta.make(5, 64, torch.device(DEVICE))
    meta.prepare_tensors(torch.tensor(MAPPING, dtype=torch.int32, device=DEVICE))
    wrapper = SimpleNamespace(
        token_mapping_meta=meta, lora_config=SimpleNamespace(specialize_active_lora=False)
    )
    out = y.clone()
    lora_hooks.add_lora_linear(wrapper, out, x, tuple(lora_a), tuple(lora_b), SCALE, tuple(widths))
    _assert_close(out, *_expected(y, x, lora_a, lora_b, widths, MAPPING))
    meta.prepare_tensors(torch.full((8,), -1, dtype=torch.int32, device=DEVICE))
    plain = y[:8].clone()
    lora_hooks.add_lora_linear(
        wrapper, plain, x[:8], tuple(lora_a), tuple(lora_b), SCALE, tuple(widths)
    )
    assert torch.equal(plain, y[:8])


if __name__ == "__main__":
    triton_checks.report(globals())
