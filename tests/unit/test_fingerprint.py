"""The device-side hash of the engines' agreement check (engine/backends/vllm/fingerprint.py).

The arithmetic is the same on any device; these run it on the CPU (the GPU run of the
two-engine agreement test in bench/gpu/run_tests.sh uses it on CUDA)."""

from __future__ import annotations

import pytest
import torch

from engine.backends.vllm import fingerprint
from engine.backends.vllm.fingerprint import device_hash


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch):
    """Chunks of 1,000 words, so that tensors of a few thousand span several."""
    monkeypatch.setattr(fingerprint, "CHUNK", 1000)
    monkeypatch.setattr(fingerprint, "_MULTIPLIERS", {})


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_equal_bits_give_equal_hashes_and_one_flipped_bit_changes_it(dtype):
    x = torch.randn(3001, generator=torch.Generator().manual_seed(0)).to(dtype)
    assert device_hash(x) == device_hash(x.clone())
    for position in (0, 999, 1000, 3000):  # first word, chunk edges, last word
        changed = x.clone()
        changed.view(torch.int16)[position * (x.element_size() // 2)] ^= 1
        assert device_hash(changed) != device_hash(x), position


def test_moved_words_change_it():
    x = torch.arange(2500, dtype=torch.float32)
    assert device_hash(x.flip(0)) != device_hash(x)
    swapped = x.clone()
    swapped[[10, 1500]] = swapped[[1500, 10]]  # across chunks: chunk order is hashed too
    assert device_hash(swapped) != device_hash(x)


def test_minus_zero_differs_from_zero_and_odd_sizes_hash():
    assert device_hash(torch.tensor([0.0, 1.0])) != device_hash(torch.tensor([-0.0, 1.0]))
    odd = torch.ones(7, dtype=torch.bfloat16)  # 14 bytes: 16-bit words
    assert device_hash(odd) != device_hash(torch.ones(7, dtype=torch.bfloat16) * 2)
    assert device_hash(torch.arange(5, dtype=torch.uint8)) != device_hash(
        torch.arange(1, 6, dtype=torch.uint8)
    )


def test_a_view_with_an_offset_hashes_like_its_copy():
    x = torch.randn(101)
    assert device_hash(x[1:]) == device_hash(x[1:].clone())
