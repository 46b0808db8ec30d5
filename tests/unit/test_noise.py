"""The noise table and its per-tensor slices (engine.noise), torch only."""

from __future__ import annotations

import pytest
import torch

from engine import noise


def test_member_seed_is_a_stable_hash():
    assert noise.member_seed(42, 3, 7) == noise.derive_seed(42, 3, 7)
    assert noise.member_seed(42, 3, 7) != noise.member_seed(42, 3, 8)
    assert 0 <= noise.member_seed(42, 3, 7) < 2**31


def test_table_is_deterministic_and_chunked_by_index():
    small = noise.build_noise_table(noise.TABLE_CHUNK + 1000, dtype=torch.float32)
    again = noise.build_noise_table(noise.TABLE_CHUNK + 1000, dtype=torch.float32)
    longer = noise.build_noise_table(2 * noise.TABLE_CHUNK, dtype=torch.float32)
    assert torch.equal(small, again)
    # chunk k depends only on k: a shorter table is a prefix of a longer one
    assert torch.equal(small, longer[: small.numel()])
    other_seed = noise.build_noise_table(1000, seed=1, dtype=torch.float32)
    assert not torch.equal(other_seed, small[:1000])


def test_bf16_table_is_the_fp32_table_rounded():
    fp32 = noise.build_noise_table(50_000, dtype=torch.float32)
    bf16 = noise.build_noise_table(50_000, dtype=torch.bfloat16)
    assert torch.equal(bf16, fp32.to(torch.bfloat16))


def test_shared_table_is_the_engines_table_built_once_a_process():
    """What a trainer holds from an engine's (length, seed, dtype): the same table, cached."""
    shared = noise.shared_noise_table(50_000, 3, "torch.bfloat16")
    assert torch.equal(shared, noise.build_noise_table(50_000, seed=3, dtype=torch.bfloat16))
    assert noise.shared_noise_table(50_000, 3, "torch.bfloat16") is shared
    assert noise.shared_noise_table(50_000, 3, "torch.float32").dtype == torch.float32


def test_table_is_standard_normal():
    table = noise.build_noise_table(1_000_000, dtype=torch.float32)
    assert abs(table.mean().item()) < 0.01
    assert abs(table.std().item() - 1.0) < 0.01


def test_table_len_covers_the_largest_tensor_twice():
    assert noise.noise_table_len(10) == noise.MIN_TABLE_LEN
    assert noise.noise_table_len(noise.MIN_TABLE_LEN) == 2 * noise.MIN_TABLE_LEN
    with pytest.raises(ValueError):
        noise.noise_table_len(0)


def test_offsets_fit_the_table_and_depend_on_seed_and_key():
    table_len = 1_000_000
    a = noise.noise_offset(5, "layer.0.weight", 1000, table_len)
    assert 0 <= a <= table_len - 1000
    assert a == noise.noise_offset(5, "layer.0.weight", 1000, table_len)
    assert a != noise.noise_offset(6, "layer.0.weight", 1000, table_len)
    assert a != noise.noise_offset(5, "layer.1.weight", 1000, table_len)
    with pytest.raises(ValueError, match="noise table"):
        noise.noise_offset(5, "huge", table_len + 1, table_len)


def test_same_shaped_tensors_never_share_noise():
    """The reference bug: every tensor reseeded with the member seed, so equal shapes got
    equal noise. Here each tensor of a member gets its own offset."""
    tensors = [(f"model.layers.{i}.input_layernorm.weight", 576) for i in range(30)]
    table = noise.build_noise_table(100_000, dtype=torch.float32)
    offsets = noise.noise_offsets(123, tensors, table.numel())
    assert len(set(offsets)) == len(offsets)
    blocks = [table[o : o + 576] for o in offsets]
    for i in range(len(blocks)):
        for j in range(i + 1, len(blocks)):
            # distinct offsets: no position holds the same table entry in both tensors
            assert not torch.equal(blocks[i], blocks[j])
            assert (blocks[i] == blocks[j]).float().mean() < 0.01


def test_offsets_stay_distinct_when_the_table_forces_collisions():
    # 40 tensors of 95 entries in a table of 100: only 6 possible offsets per tensor, so
    # hashes collide and must be redrawn; 40 distinct values cannot fit in 6 slots, so use
    # a table where they can: 50 slots for 40 tensors.
    tensors = [(f"t{i}", 51) for i in range(40)]
    offsets = noise.noise_offsets(7, tensors, 100)
    assert len(set(offsets)) == 40
    assert all(0 <= o <= 49 for o in offsets)


def test_offsets_do_not_depend_on_listing_order():
    tensors = [(f"w{i}", 100 + i) for i in range(20)]
    forward = noise.noise_offsets(9, tensors, 10_000)
    backward = noise.noise_offsets(9, tensors[::-1], 10_000)
    assert forward == backward[::-1]


def test_perturb_overwrites_from_the_snapshot():
    table = noise.build_noise_table(10_000, dtype=torch.bfloat16)
    snapshot = torch.randn(40, 25).to(torch.bfloat16)
    live = snapshot.clone()
    noise.perturb_(live, snapshot, table, 100, 0.01)
    first = live.clone()
    noise.perturb_(live, snapshot, table, 5000, 0.01)  # the next member
    noise.perturb_(live, snapshot, table, 100, 0.01)  # back to the first member
    assert torch.equal(live, first)
    assert not torch.equal(live, snapshot)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_perturb_rounds_every_entry_once_whatever_the_threads(dtype):
    """Every entry is fp32(w) + fp32(scale in the weights' dtype) * fp32(eps), rounded once
    (what torch.add's vector loop computes), also in small tensors and the last entries of
    each thread's chunk, which torch.add's scalar loop computed otherwise (about 1 entry in
    50 came out one rounding step off there)."""
    n = 3 * 2**16 + 45  # not a multiple of any vector width or thread chunk
    table = noise.build_noise_table(2 * n, dtype=dtype)
    scale = 0.0123
    rounded = torch.tensor(scale, dtype=dtype).float()
    threads = torch.get_num_threads()
    try:
        for count, size, offsets in ((1, n, [77]), (3, n, [77]), (1, 60, range(0, 6000, 60))):
            torch.set_num_threads(count)
            snapshot = torch.randn(size).to(dtype)
            for offset in offsets:
                eps = table[offset : offset + size].float()
                expected = (snapshot.float() + rounded * eps).to(dtype)
                live = torch.empty_like(snapshot)
                noise.perturb_(live, snapshot, table, offset, scale)
                assert torch.equal(live.view(torch.int16), expected.view(torch.int16))
    finally:
        torch.set_num_threads(threads)


def _reference_update(master, table, offsets, coefficients):
    """Unchunked, one fp32 add per member, in order (torch may fuse c * eps + m in one
    rounding; whatever it does, the chunked path must do the same)."""
    out = master.clone().view(-1)
    for o, c in zip(offsets, coefficients, strict=True):
        if c != 0.0:
            out.add_(table[o : o + out.numel()].float(), alpha=c)
    return out.view(master.shape)


def test_accumulate_is_fp32_in_member_order_across_chunk_boundaries():
    n = noise.UPDATE_CHUNK * 2 + 123  # crosses chunk boundaries
    table = noise.build_noise_table(4 * n, dtype=torch.bfloat16)
    master = torch.randn(n, dtype=torch.float32)
    offsets, coefficients = [0, 17, n, 3 * n - 5], [1e-3, -2e-3, 5e-4, 0.25]
    expected = _reference_update(master, table, offsets, coefficients)
    chunked = master.clone()
    noise.accumulate_(chunked, table, offsets, coefficients)
    assert torch.equal(chunked, expected)
    # the fp32-table path (no conversion) gives the same bits
    direct = master.clone()
    noise.accumulate_(direct, table.float(), offsets, coefficients)
    assert torch.equal(direct, expected)


def test_zero_coefficients_leave_every_bit_alone():
    table = noise.build_noise_table(1000, dtype=torch.bfloat16)
    master = torch.tensor([-0.0, 0.0, 1.5, -2.0] * 10, dtype=torch.float32)
    before = master.clone()
    noise.accumulate_(master, table, [3, 9], [0.0, 0.0])
    assert torch.equal(master.view(torch.int32), before.view(torch.int32))


def test_accumulate_checks_lengths():
    table = noise.build_noise_table(100, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="coefficients"):
        noise.accumulate_(torch.zeros(10), table, [1, 2], [0.1])
