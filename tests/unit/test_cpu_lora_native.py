"""Building, caching and guarding the per-token multi-LoRA C kernel (its sums are tested in
test_cpu_lora.py)."""

from __future__ import annotations

import logging

import pytest
import torch

from engine.backends.vllm.cpu import native as cpu_lora_native


def test_the_kernel_is_built_once_into_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv(cpu_lora_native.CACHE_ENV, str(tmp_path))
    assert cpu_lora_native.kernel.__wrapped__() is not None
    built = list(tmp_path.glob("cpu_lora_tokens-*.so"))
    assert len(built) == 1 and not list(tmp_path.glob("tmp*"))  # no scratch folder left

    def no_build(*args):
        raise AssertionError("rebuilt although the cache holds the library")

    monkeypatch.setattr(cpu_lora_native, "_build", no_build)
    assert cpu_lora_native.kernel.__wrapped__() is not None


def test_a_failed_build_leaves_the_torch_path_and_says_why(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv(cpu_lora_native.CACHE_ENV, str(tmp_path))
    monkeypatch.setenv("CC", "false")  # a "compiler" that fails
    with caplog.at_level(logging.WARNING):
        assert cpu_lora_native.kernel.__wrapped__() is None
    assert "did not build" in caplog.text
    assert not list(tmp_path.rglob("*.so"))


def _case(tokens=6, adapters=3, rank=2, width=16):
    bf16 = torch.bfloat16
    return dict(
        y=torch.zeros(tokens, 2 * width, dtype=bf16),
        x=torch.randn(tokens, width).to(bf16),
        index=torch.zeros(tokens, dtype=torch.int64),
        a=torch.randn(adapters, 2 * rank, width).to(bf16),
        b=torch.randn(adapters, 2 * rank, 2 * width).to(bf16),
        bounds=torch.tensor([0, width, 2 * width]),
        rank=rank,
        scale=1.0,
    )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"index": torch.zeros(5, dtype=torch.int64)}, "mismatched shapes"),
        ({"bounds": torch.tensor([0, 16, 40])}, "mismatched shapes"),
        ({"x": torch.randn(6, 16)}, "must be bf16"),
        ({"index": torch.zeros(6, dtype=torch.int32)}, "contiguous int64"),
        ({"index": torch.tensor([0, 1, 2, 3, 0, 0])}, "adapter index 3 beyond the 3 adapters"),
    ],
)
def test_inputs_the_kernel_would_misread_are_refused(change, message):
    kernel = cpu_lora_native.kernel()
    assert kernel is not None
    case = _case() | change
    before = case["y"].clone()
    with pytest.raises(ValueError, match=message):
        kernel(**case)
    assert torch.equal(case["y"], before)
