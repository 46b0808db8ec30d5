"""The grouped CPU multi-LoRA kernels give what vLLM's per-token torch ops give."""

from __future__ import annotations

import pytest
import torch

from engine.backends.vllm import cpu_lora

torch_ops = pytest.importorskip("vllm.lora.ops.torch_ops")


def _case(tokens=37, adapters=5, rank=8, width=24, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, width, generator=g)
    a = torch.randn(adapters, 1, rank, width, generator=g)
    b = torch.randn(adapters, 1, width, rank, generator=g)
    indices = torch.randint(0, adapters, (tokens,), generator=g)
    return x, a, b, indices


def test_shrink_and_expand_match_vllm():
    x, a, b, indices = _case()
    ours, theirs = torch.zeros(37, 8), torch.zeros(37, 8)
    cpu_lora.bgmv_shrink(x, a, ours, indices, 0.5)
    torch_ops.bgmv_shrink(x, a, theirs, indices, 0.5)
    torch.testing.assert_close(ours, theirs)
    y0 = torch.randn(37, 24)
    ours_y, theirs_y = y0.clone(), y0.clone()
    cpu_lora.bgmv_expand(ours, b, ours_y, indices, add_inputs=True)
    torch_ops.bgmv_expand(theirs, b, theirs_y, indices, add_inputs=True)
    torch.testing.assert_close(ours_y, theirs_y)
    ours_s, theirs_s = torch.zeros(37, 40), torch.zeros(37, 40)
    cpu_lora.bgmv_expand_slice(ours, b, ours_s, indices, 10, 24, add_inputs=False)
    torch_ops.bgmv_expand_slice(theirs, b, theirs_s, indices, 10, 24, add_inputs=False)
    torch.testing.assert_close(ours_s, theirs_s)


def test_segmented_variants_expand_sequences_to_tokens():
    x, a, _, _ = _case(tokens=10)
    seq_lens, seq_loras = torch.tensor([3, 5, 2]), torch.tensor([4, 0, 4])
    ours, theirs = torch.zeros(10, 8), torch.zeros(10, 8)
    args = (torch.tensor([0, 3, 8]), seq_lens, seq_loras, 3, 5, 10)
    cpu_lora.sgmv_shrink(x, a, ours, *args, 2.0)
    torch_ops.sgmv_shrink(x, a, theirs, *args, 2.0)
    torch.testing.assert_close(ours, theirs)


def test_tokens_without_an_adapter_get_no_lora_term():
    x, a, _, indices = _case(tokens=6)
    indices = torch.tensor([2, -1, 2, 0, -1, 3])
    out = cpu_lora.lora_matmul(x, a, indices)
    assert torch.count_nonzero(out[[1, 4]]) == 0
    torch.testing.assert_close(out[0], x[0] @ a[2, 0].T)
    assert torch.count_nonzero(cpu_lora.lora_matmul(x, a, torch.full((6,), -1))) == 0


def test_install_points_the_cpu_punica_wrapper_at_the_grouped_kernels():
    from vllm.lora.punica_wrapper import punica_cpu

    assert cpu_lora.install_grouped_cpu_lora()
    assert punica_cpu.sgmv_shrink is cpu_lora.sgmv_shrink
    assert punica_cpu.bgmv_expand_slice is cpu_lora.bgmv_expand_slice


def test_a_reused_plan_follows_indices_changed_in_place():
    x, a, _, _ = _case(tokens=4)
    indices = torch.tensor([0, 1, 2, 3])
    first = cpu_lora.lora_matmul(x, a, indices)
    indices[:] = torch.tensor([3, 3, -1, 0])  # the same tensor, new values (next step)
    second = cpu_lora.lora_matmul(x, a, indices)
    torch.testing.assert_close(first[0], x[0] @ a[0, 0].T)
    torch.testing.assert_close(second[0], x[0] @ a[3, 0].T)
    assert torch.count_nonzero(second[2]) == 0
