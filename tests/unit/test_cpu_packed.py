"""Weights stored packed (cpu/packed.py): the layout, writes through it, and a perturbation
that draws the logical tensor's noise bit for bit, with the C kernel and without it. Runs on
any CPU: the layout is plain index arithmetic (test_cpu_weights.py checks vLLM's own kernel
packs the same way, where a CPU has it)."""

from __future__ import annotations

import pytest
import torch

from engine import noise
from engine.backends.vllm import shards
from engine.backends.vllm.cpu import packed

TABLE = noise.build_noise_table(2**20)


def explicit_pack(logical: torch.Tensor, block: int = packed.BLOCK_ROWS) -> torch.Tensor:
    """The VNNI layout entry by entry: packed[b, j, r, t] = logical[b * block + r, 2 j + t]."""
    n, k = logical.shape
    out = torch.empty(n // block, k // 2, block, 2, dtype=logical.dtype)
    for b in range(n // block):
        for r in range(block):
            out[b, :, r, :] = logical[b * block + r].view(k // 2, 2)
    return out.view(n, k)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_layout_round_trips_and_is_the_vnni_blocks(dtype):
    logical = torch.randn(96, 64).to(dtype)
    layout = packed.PackedLayout(96, 64)
    live = packed.to_live(logical, layout)
    assert torch.equal(live, explicit_pack(logical))
    assert torch.equal(packed.to_logical(live, layout), logical)
    written = torch.zeros_like(live)
    packed.write_live_(written, logical, layout)
    assert torch.equal(written, live)
    plain = torch.zeros_like(logical)
    packed.write_live_(plain, logical, None)  # unpacked: a plain copy
    assert torch.equal(plain, logical)
    assert packed.fits(96, 64) and not packed.fits(80, 64) and not packed.fits(96, 63)


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int16)


def logical_perturbation(snapshot, offset, scale, segments):
    """What an unpacked engine serves: engine.noise.perturb_ in the logical layout."""
    out = torch.empty_like(snapshot)
    noise.perturb_(out, snapshot, TABLE, offset, scale, segments)
    return out


CASES = {
    # (whole shape, shard rule, rank, size)
    "whole": ((96, 64), shards.WHOLE, 0, 1),
    "column shard": (
        (256, 64),
        shards.ShardRule(0, (shards.Part(128, 4), shards.Part(64, 1), shards.Part(64, 1))),
        1,
        2,
    ),
    "row-parallel shard": ((64, 192), shards.ShardRule(1, (shards.Part(192, 192),)), 1, 3),
}


@pytest.mark.parametrize("kernel", [True, False], ids=["C kernel", "torch"])
@pytest.mark.parametrize("case", list(CASES))
def test_a_packed_perturbation_is_the_logical_draw_bit_for_bit(case, kernel, monkeypatch):
    if not kernel:
        monkeypatch.setattr(packed, "_kernel", lambda: None)
    elif packed._kernel() is None:
        pytest.skip("no C compiler here")
    shape, rule, rank, size = CASES[case]
    where = shards.shard_map(rule, shape, rank, size)
    segments = where.segments()
    n, k = where.shard_shape
    layout = packed.PackedLayout(n, k)
    rows = packed.noise_rows(segments, where.shard_shape)
    snapshot = (torch.randn(n, k) * 0.05).bfloat16()
    for offset, scale in [(0, 0.01), (12_345, 0.002), (99_999, -0.37)]:  # odd offsets too
        live = torch.full((n, k), float("nan"), dtype=torch.bfloat16)
        packed.perturb_(live, snapshot, TABLE, offset, scale, segments, layout, rows)
        expected = logical_perturbation(snapshot, offset, scale, segments)
        assert torch.equal(bits(packed.to_logical(live, layout)), bits(expected)), offset
        assert not torch.equal(expected, snapshot)


def test_noise_rows_are_where_each_rows_noise_starts():
    where = shards.shard_map(shards.ShardRule(1, (shards.Part(192, 192),)), (64, 192), 2, 3)
    rows = packed.noise_rows(where.segments(), where.shard_shape)
    assert rows.tolist() == [128 + 192 * i for i in range(64)]  # columns 128..191 of each row
    whole = packed.noise_rows(noise.whole(96 * 64), (96, 64))
    assert whole.tolist() == [64 * i for i in range(96)]
    with pytest.raises(ValueError, match="does not cover whole rows"):
        packed.noise_rows([noise.Segment(0, 1, 10, 0, 10)], (96, 64))
