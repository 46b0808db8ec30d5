"""Tensor-parallel shards (engine/backends/vllm/shards.py) against vLLM's own layers.

vLLM's layers are built on the CPU as rank r of k (its tensor-parallel group faked for the
constructor) and filled by their own weight loaders from one checkpoint, so each shard is
exactly what a rank of a real engine holds. The shard maps must find those shards in the
whole (size 1) tensor, and noise applied rank by rank must give the whole tensor's noise bit
for bit: perturbation and update, with the kernels the engine runs.
"""

from __future__ import annotations

from types import SimpleNamespace
from unittest import mock

import pytest
import torch

from engine import noise
from engine.backends.vllm import masters, shards

HIDDEN, HEAD, HEADS, MLP, VOCAB = 72, 24, 4, 104, 1010
"""Sizes with the awkward cases: 72 and 104 are no multiple of a vector width, and the
vocabulary is padded to 1024 rows."""

SIZES = (1, 2, 4)


def build(rank: int, size: int) -> dict[str, torch.nn.Module]:
    """vLLM's parallel layers as rank `rank` of `size` builds them."""
    import vllm.distributed.parallel_state as state
    from vllm.model_executor.layers import linear
    from vllm.model_executor.layers import vocab_parallel_embedding as vocab

    group = SimpleNamespace(rank_in_group=rank, world_size=size)
    bf16 = {"params_dtype": torch.bfloat16}
    with mock.patch.object(state, "get_tp_group", return_value=group):
        return {
            # one key-value head: copied to every rank
            "qkv": linear.QKVParallelLinear(HIDDEN, HEAD, HEADS, 1, bias=True, **bf16),
            # two: split over 2 ranks, each copied to 2 of 4
            "qkv2": linear.QKVParallelLinear(HIDDEN, HEAD, HEADS, 2, bias=True, **bf16),
            "gate_up": linear.MergedColumnParallelLinear(HIDDEN, [MLP, MLP], bias=True, **bf16),
            "column": linear.ColumnParallelLinear(HIDDEN, 40, bias=True, **bf16),
            "down": linear.RowParallelLinear(MLP, HIDDEN, bias=True, **bf16),
            "embed": vocab.VocabParallelEmbedding(VOCAB, HIDDEN, **bf16),
            "lm_head": vocab.ParallelLMHead(VOCAB, HIDDEN, bias=True, **bf16),
            "norm": torch.nn.LayerNorm(HIDDEN, dtype=torch.bfloat16),
        }


def checkpoint() -> dict[str, list[tuple[str, object, torch.Tensor]]]:
    """Per layer: (parameter, shard id, checkpoint tensor), as a model's load_weights passes
    them to the layer's weight loader."""
    g = torch.Generator().manual_seed(0)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g).to(torch.bfloat16)

    def qkv(kv_heads: int) -> list[tuple[str, object, torch.Tensor]]:
        rows = {"q": HEADS * HEAD, "k": kv_heads * HEAD, "v": kv_heads * HEAD}
        return [
            (a, s, randn(n, HIDDEN) if a == "weight" else randn(n))
            for a in ("weight", "bias")
            for s, n in rows.items()
        ]

    return {
        "qkv": qkv(1),
        "qkv2": qkv(2),
        "gate_up": [
            (a, i, randn(MLP, HIDDEN) if a == "weight" else randn(MLP))
            for a in ("weight", "bias")
            for i in (0, 1)
        ],
        "column": [("weight", None, randn(40, HIDDEN)), ("bias", None, randn(40))],
        "down": [("weight", None, randn(HIDDEN, MLP)), ("bias", None, randn(HIDDEN))],
        "embed": [("weight", None, randn(VOCAB, HIDDEN))],
        "lm_head": [("weight", None, randn(VOCAB, HIDDEN)), ("bias", None, randn(VOCAB))],
    }


def loaded(rank: int, size: int) -> dict[str, torch.nn.Module]:
    layers = build(rank, size)
    for key, entries in checkpoint().items():
        for attr, shard_id, tensor in entries:
            param = getattr(layers[key], attr)
            args = () if shard_id is None else (shard_id,)
            param.weight_loader(param, tensor, *args)
    return layers


def params(
    layers: dict[str, torch.nn.Module],
) -> dict[str, tuple[torch.nn.Module, str, torch.Tensor]]:
    return {
        f"{key}.{attr}": (layer, attr, p.data)
        for key, layer in layers.items()
        for attr, p in layer.named_parameters()
    }


@pytest.fixture(scope="module")
def ranks() -> dict[int, list[dict]]:
    """size -> each rank's parameters (name -> (layer, attr, tensor))."""
    return {size: [params(loaded(r, size)) for r in range(size)] for size in SIZES}


def maps(ranks, size: int, name: str) -> list[shards.ShardMap]:
    out = []
    for rank, held in enumerate(ranks[size]):
        layer, attr, tensor = held[name]
        rule = shards.rule_of(layer, attr)
        out.append(shards.shard_map(rule, shards.whole_shape(rule, tensor.shape), rank, size))
    return out


def test_rules_are_the_same_at_every_size(ranks):
    for name, (layer, attr, _) in ranks[1][0].items():
        rule = shards.rule_of(layer, attr)
        for size in SIZES:
            for held in ranks[size]:
                assert shards.rule_of(held[name][0], attr) == rule, (name, size)


def test_each_rank_holds_what_its_map_takes_from_the_whole_tensor(ranks):
    for name, (_, _, whole) in ranks[1][0].items():
        for size in SIZES:
            for m, held in zip(maps(ranks, size, name), ranks[size], strict=True):
                assert m.shape == tuple(whole.shape), (name, size)
                assert m.shard_shape == tuple(held[name][2].shape), (name, size)
                assert torch.equal(m.take(whole), held[name][2]), (name, size)


def test_rank_maps_cover_the_whole_tensor(ranks):
    """Put back together, the shards are the whole tensor; copies (a kv head on several
    ranks, a norm on all) agree."""
    for name, (_, _, whole) in ranks[1][0].items():
        for size in SIZES:
            rebuilt = torch.full_like(whole, float("nan"))
            filled: set[shards.Block] = set()
            for m, held in zip(maps(ranks, size, name), ranks[size], strict=True):
                m.put(rebuilt, held[name][2], filled)
            assert torch.equal(rebuilt, whole), (name, size)


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(-1).view(torch.uint8)


def rebuild(ranks, size: int, name: str, shard_of) -> torch.Tensor:
    """The whole tensor from `shard_of(rank, map, shard)` of every rank."""
    whole = ranks[1][0][name][2]
    out = None
    filled: set[shards.Block] = set()
    for rank, (m, held) in enumerate(zip(maps(ranks, size, name), ranks[size], strict=True)):
        shard = shard_of(rank, m, held[name][2])
        if out is None:
            out = torch.empty(whole.shape, dtype=shard.dtype)
        m.put(out, shard, filled)
    return out


@pytest.mark.parametrize("size", [2, 4])
def test_perturbing_rank_by_rank_gives_the_whole_perturbation_bit_for_bit(ranks, size):
    table = noise.build_noise_table(1 << 18, dtype=torch.bfloat16)
    for i, (name, (_, _, whole)) in enumerate(ranks[1][0].items()):
        offset, scale = 1000 + 7919 * i, 0.0123 * (-1) ** i
        expected = torch.empty_like(whole)
        noise.perturb_(expected, whole, table, offset, scale)

        def perturbed(rank, m, shard, offset=offset, scale=scale):
            out = torch.empty_like(shard)
            noise.perturb_(out, shard, table, offset, scale, m.segments())
            return out

        assert torch.equal(bits(rebuild(ranks, size, name, perturbed)), bits(expected)), name


@pytest.mark.parametrize("size", [2, 4])
@pytest.mark.parametrize("table_dtype", [torch.float32, torch.bfloat16])
def test_updating_rank_by_rank_gives_the_whole_update_bit_for_bit(
    ranks, size, table_dtype, monkeypatch
):
    """Both update kernels: the fp32 table read directly, and bf16 noise converted block by
    block (blocks made small, so they split rows and column ranges)."""
    monkeypatch.setattr(noise, "UPDATE_CHUNK", 50)
    table = noise.build_noise_table(1 << 18, dtype=table_dtype)
    offsets, coefficients = [11, 5003, 90001], [1.3e-3, -7e-4, 2.5e-3]
    for i, (name, (_, _, whole)) in enumerate(ranks[1][0].items()):
        member_offsets = [o + 31 * i for o in offsets]
        expected = whole.float()
        noise.accumulate_(expected, table, member_offsets, coefficients)
        assert not torch.equal(expected, whole.float())

        def updated(rank, m, shard, member_offsets=member_offsets):
            master = shard.float()
            noise.accumulate_(master, table, member_offsets, coefficients, None, m.segments())
            return master

        assert torch.equal(bits(rebuild(ranks, size, name, updated)), bits(expected)), name


def test_a_whole_tensor_is_one_segment_and_gate_up_two():
    whole = shards.shard_map(shards.WHOLE, (10, 4), 0, 1)
    assert whole.segments() == noise.whole(40)
    rule = shards.ShardRule(0, (shards.Part(6, 6), shards.Part(6, 6)))
    assert shards.shard_map(rule, (12, 4), 0, 1).segments() == noise.whole(48)  # size 1
    rank1 = shards.shard_map(rule, (12, 4), 1, 2)
    assert rank1.segments() == (
        noise.Segment(0, 1, 12, 12, 12),  # rows 3-5 of gate
        noise.Segment(12, 1, 12, 36, 12),  # rows 9-11 (3-5 of up)
    )
    columns = shards.shard_map(shards.ShardRule(1, (shards.Part(8, 8),)), (3, 8), 1, 2)
    assert columns.segments() == (noise.Segment(0, 3, 4, 4, 8),)


def test_shards_that_do_not_split_evenly_are_refused():
    rule = shards.ShardRule(0, (shards.Part(9 * 64, 9),))  # 9 heads over 2 ranks
    with pytest.raises(ValueError, match="does not split over 2 ranks"):
        shards.shard_map(rule, (9 * 64, 8), 0, 2)
    with pytest.raises(ValueError, match="rank 2 of tensor-parallel size 2"):
        shards.shard_map(rule, (9 * 64, 8), 2, 2)


def test_copies_that_disagree_are_refused():
    rule = shards.ShardRule(0, (shards.Part(4, 1),))  # one head, copied to both ranks
    whole, filled = torch.zeros(4, 2), set()
    first = shards.shard_map(rule, (4, 2), 0, 2)
    first.put(whole, torch.ones(4, 2), filled)
    with pytest.raises(ValueError, match="ranks hold different values for rows 0-3"):
        shards.shard_map(rule, (4, 2), 1, 2).put(whole, torch.full((4, 2), 2.0), filled)


def test_layers_of_unknown_sharding_have_no_rule():
    """A sharded layer kind the module does not know (here a subclass of a known one, which
    may lay its shard out otherwise): None, which a rank of a larger engine refuses."""
    from vllm.model_executor.layers import linear

    class Custom(linear.ColumnParallelLinear):
        pass

    with mock.patch.object(linear.LinearBase, "__init__", lambda self, *a, **k: None):
        layer = object.__new__(Custom)
        torch.nn.Module.__init__(layer)
    assert shards.rule_of(layer, "weight") is None
    assert shards.rule_of(torch.nn.LayerNorm(4), "weight") == shards.WHOLE


# ---- masters saved at one size, loaded at another (masters.py) ------------------------------


def save(ranks, size: int, folder) -> None:
    for rank, held in enumerate(ranks[size]):
        tensors = {name: t.float() for name, (_, _, t) in held.items()}
        masters.write(folder, rank, size, tensors)


@pytest.mark.parametrize(("saved", "loaded_at"), [(2, 1), (1, 4), (2, 4), (4, 2), (2, 2)])
def test_a_master_saved_at_one_size_loads_at_another(ranks, tmp_path, saved, loaded_at):
    save(ranks, saved, tmp_path)
    names = set(ranks[1][0])
    for rank, held in enumerate(ranks[loaded_at]):
        with masters.SavedMaster(tmp_path, rank, loaded_at) as master:
            master.check_names(names)
            assert master.saved_size == saved
            for name, (layer, attr, tensor) in held.items():
                shard = master.read(name, shards.rule_of(layer, attr))
                assert torch.equal(shard, tensor.float()), (name, rank)


def test_an_incomplete_or_mixed_master_is_refused(ranks, tmp_path):
    save(ranks, 2, tmp_path)
    (tmp_path / masters.master_file(1, 2)).unlink()
    with pytest.raises(FileNotFoundError, match=r"master-tp1-of-2\.safetensors missing"):
        masters.SavedMaster(tmp_path, 0, 1)
    save(ranks, 4, tmp_path)
    with pytest.raises(ValueError, match=r"several tensor-parallel sizes: \[2, 4\]"):
        masters.SavedMaster(tmp_path, 0, 1)
    with pytest.raises(FileNotFoundError, match="no saved master"):
        masters.SavedMaster(tmp_path / "nothing", 0, 1)


def test_saved_copies_that_disagree_are_refused(ranks, tmp_path):
    """A key-value head held by both ranks must be the same in both files."""
    save(ranks, 2, tmp_path)
    rank1 = {name: t.float() for name, (_, _, t) in ranks[2][1].items()}
    rank1["qkv.weight"][HEADS // 2 * HEAD] += 1.0  # rank 1's copy of the kv head
    masters.write(tmp_path, 1, 2, rank1)
    layer, attr, _ = ranks[1][0]["qkv.weight"]
    with (
        masters.SavedMaster(tmp_path, 0, 1) as master,
        pytest.raises(
            ValueError, match=r"master-tp1-of-2\.safetensors: qkv\.weight: ranks hold different"
        ),
    ):
        master.read("qkv.weight", shards.rule_of(layer, attr))


def test_unknown_sharding_loads_only_at_its_own_size(ranks, tmp_path):
    save(ranks, 2, tmp_path)
    with (
        masters.SavedMaster(tmp_path, 0, 1) as master,
        pytest.raises(ValueError, match="loads only at that size"),
    ):
        master.read("qkv.weight", None)
