"""Low-rank members (engine.lowrank.factors): seeded factors, antithetic sign, per-layer
scaling, the update math, and the adapter files. Hand-sized shapes; no engine."""

from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors.torch import load_file

from engine import noise
from engine.lowrank import factors as lora
from engine.lowrank.factors import LoraTarget

SPECS = {
    "model.embed_tokens.weight": ((50, 8), "BF16"),
    "model.layers.0.self_attn.q_proj.weight": ((8, 8), "BF16"),
    "model.layers.0.mlp.down_proj.weight": ((8, 12), "BF16"),
    "model.layers.1.self_attn.q_proj.weight": ((8, 8), "BF16"),
    "model.layers.1.mlp.down_proj.weight": ((8, 12), "BF16"),
    "model.layers.0.input_layernorm.weight": ((8,), "BF16"),
}
Q0 = LoraTarget("model.layers.0.self_attn.q_proj", 0, "q_proj", 8, 8)
DOWN1 = LoraTarget("model.layers.1.mlp.down_proj", 1, "down_proj", 12, 8)
TABLE = noise.build_noise_table(1 << 16)
"""A small noise table (bf16, as the engines' default): the factors are blocks of it."""


def unit(seed: int, target: LoraTarget, rank: int, scale: float) -> tuple[torch.Tensor, ...]:
    """One seed's unit factors (A [r, in], B' [out, r]) on one target, layer scale `scale`."""
    a, b = lora.unit_factors(TABLE, [seed], [target], rank, {target.layer: scale})[target.name]
    return a[0], b[0]


def dense(seeds, coefficients, target: LoraTarget, rank: int, scale: float) -> torch.Tensor:
    """The merged update m_l / sqrt(r) * sum_i c_i B_i A_i, member by member."""
    expected = torch.zeros(target.out_features, target.in_features)
    for seed, c in zip(seeds, coefficients, strict=True):
        a, b = unit(seed, target, rank, scale)
        expected += c * (b @ a)
    return expected


def test_parse_modules_and_layers():
    assert lora.parse_modules("q_proj, v_proj") == ("q_proj", "v_proj")
    assert lora.parse_layers("0-2,5") == (0, 1, 2, 5)
    assert lora.parse_layers(None) is None
    for bad in ("", "q_proj,,v_proj"):
        with pytest.raises(ValueError, match="comma-separated"):
            lora.parse_modules(bad)
    with pytest.raises(ValueError, match="backwards"):
        lora.parse_layers("3-1")
    with pytest.raises(ValueError, match="layer numbers"):
        lora.parse_layers("a")


def test_find_targets_selects_modules_and_layers_sorted():
    targets = lora.find_targets(SPECS, ("q_proj", "down_proj"), (1,))
    assert [t.name for t in targets] == [
        "model.layers.1.mlp.down_proj",
        "model.layers.1.self_attn.q_proj",
    ]
    assert targets[0] == DOWN1
    assert len(lora.find_targets(SPECS, ("q_proj",), None)) == 2
    with pytest.raises(ValueError, match="gate_proj"):
        lora.find_targets(SPECS, ("gate_proj",), None)
    with pytest.raises(ValueError, match=r"\[7\] do not exist"):
        lora.find_targets(SPECS, ("q_proj",), (0, 7))


def test_factors_are_table_blocks_seeded_per_member_and_target():
    drawn = lora.member_factors(TABLE, [5, 6], [Q0, DOWN1], 2)
    a, b = drawn[Q0.name]
    assert a.shape == (2, 2, 8) and b.shape == (2, 8, 2) and a.dtype == torch.float32
    again = lora.member_factors(TABLE, [6], [DOWN1, Q0], 2)  # stacked in seed order
    assert torch.equal(a[1], again[Q0.name][0][0]) and torch.equal(b[1], again[Q0.name][1][0])
    assert not torch.equal(a[0], a[1]) and not torch.equal(b[0], b[1])  # another seed
    assert not torch.equal(a[0, :, :8], drawn[DOWN1.name][0][0, :, :8])  # another target
    # one contiguous block of r * (in + out) entries at the member's offset: A, then B
    offsets = lora.factor_offsets(5, [Q0, DOWN1], 2, TABLE.numel())
    assert offsets[0] != offsets[1]
    block = TABLE[offsets[0] : offsets[0] + lora.factor_size(Q0, 2)].float()
    assert torch.equal(torch.cat([a[0].flatten(), b[0].flatten()]), block)
    assert lora.factor_size(Q0, 2) == 2 * 8 + 8 * 2  # A and B side by side, never overlapping


def test_factors_have_unit_variance():
    wide = LoraTarget("model.layers.0.mlp.up_proj", 0, "up_proj", 256, 256)
    a, b = lora.member_factors(TABLE, range(32), [wide], 4)[wide.name]
    values = torch.cat([a.flatten(), b.flatten()])
    assert abs(float(values.mean())) < 0.02 and abs(float(values.var()) - 1.0) < 0.05


def test_antithetic_members_differ_only_in_sign_and_scale_by_layer():
    units = lora.unit_factors(TABLE, [5], [Q0], 2, {0: 0.5})[Q0.name]
    a, b = lora.member_stack(units, torch.tensor([0, 0]), torch.tensor([0.1, -0.1]))
    assert torch.equal(a[0], a[1]) and torch.equal(b[0], -b[1])
    raw_a, raw_b = lora.member_factors(TABLE, [5], [Q0], 2)[Q0.name]
    expected = 0.1 * 0.5 / math.sqrt(2) * (raw_b[0] @ raw_a[0])
    torch.testing.assert_close(b[0] @ a[0], expected)


def test_layer_scales_are_mean_abs_of_the_layer_targets():
    weights = {
        "model.layers.0.self_attn.q_proj.weight": torch.full((8, 8), -2.0),
        "model.layers.0.mlp.down_proj.weight": torch.full((8, 12), 4.0),
    }
    targets = [Q0, LoraTarget("model.layers.0.mlp.down_proj", 0, "down_proj", 12, 8)]
    assert lora.layer_scales(weights, targets, "layer") == {0: 3.0}
    assert lora.layer_scales(weights, targets, "none") == {0: 1.0}


def test_low_rank_sum_is_the_weighted_sum_of_low_rank_products():
    seeds, coefficients = [3, 4], [0.5, -2.0]
    a, b = lora.unit_factors(TABLE, seeds, [DOWN1], 3, {1: 0.25})[DOWN1.name]
    got = lora.low_rank_sum(a, b, torch.tensor(coefficients))
    torch.testing.assert_close(got, dense(seeds, coefficients, DOWN1, 3, 0.25))
    raw_a, raw_b = lora.member_factors(TABLE, [3], [DOWN1], 3)[DOWN1.name]
    torch.testing.assert_close(b[0] @ a[0], 0.25 / math.sqrt(3) * raw_b[0] @ raw_a[0])
    with pytest.raises(ValueError, match="2 factor pairs and 1 coefficients"):
        lora.low_rank_sum(a, b, torch.tensor([1.0]))


def test_trained_adapter_keeps_the_best_rank_r_approximation():
    adapter = lora.TrainedAdapter([DOWN1], rank=2)
    scales = {1: 1.0}
    adapter.add(TABLE, [3], [0.7], scales)  # one rank-2 term: kept exactly
    torch.testing.assert_close(adapter.delta(DOWN1.name), dense([3], [0.7], DOWN1, 2, 1.0))
    adapter.add(TABLE, [4, 5], [0.3, -0.2], scales)  # rank 6 in total: truncated to 2
    full = dense([3, 4, 5], [0.7, 0.3, -0.2], DOWN1, 2, 1.0)
    u, s, vh = torch.linalg.svd(full)
    best = (u[:, :2] * s[:2]) @ vh[:2]
    torch.testing.assert_close(adapter.delta(DOWN1.name), best, atol=1e-5, rtol=1e-4)
    restored = lora.TrainedAdapter([DOWN1], rank=2)
    restored.load_state(adapter.state())
    assert torch.equal(restored.delta(DOWN1.name), adapter.delta(DOWN1.name))


def test_members_stack_their_seeds_factors_scaled_behind_the_trained_adapter():
    adapter = lora.TrainedAdapter([DOWN1], rank=2)
    adapter.add(TABLE, [3], [0.7], {1: 1.0})
    units = lora.unit_factors(TABLE, [9, 4], [DOWN1], 2, {1: 0.5})[DOWN1.name]
    picks, scales = torch.tensor([0, 0, 1]), torch.tensor([-0.1, 0.1, 0.3])
    a, b = lora.member_stack(units, picks, scales, adapter.factors[DOWN1.name])
    assert a.shape == (3, 4, 12) and b.shape == (3, 8, 4)
    for m, (seed, scale) in enumerate([(9, -0.1), (9, 0.1), (4, 0.3)]):
        pa, pb = unit(seed, DOWN1, 2, 0.5)
        torch.testing.assert_close(b[m] @ a[m], adapter.delta(DOWN1.name) + scale * pb @ pa)
    plain_a, plain_b = lora.member_stack(units, picks, scales)
    assert torch.equal(plain_b[0], -plain_b[1]) and torch.equal(plain_a[0], plain_a[1])


def test_written_adapter_is_peft_format_and_folds_alpha_into_b(tmp_path):
    a, b = unit(5, Q0, 2, 1.0)
    folder = lora.write_adapter(
        tmp_path / "ad", {Q0.name: (a, b)}, rank=2, alpha=8.0, base_model="m"
    )
    config = json.loads((folder / lora.ADAPTER_CONFIG).read_text())
    assert config["peft_type"] == "LORA" and config["r"] == 2 and config["lora_alpha"] == 8.0
    assert config["target_modules"] == ["q_proj"] and config["layers_to_transform"] == [0]
    tensors = load_file(folder / lora.ADAPTER_WEIGHTS)
    stored_a = tensors["base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"]
    stored_b = tensors["base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"]
    torch.testing.assert_close(8.0 / 2 * stored_b @ stored_a, b @ a)


def test_a_model_folder_without_weights_is_a_clear_error(tmp_path):
    from engine.config import RunConfig
    from engine.lowrank.population import LoraPopulation

    model = tmp_path / "model"
    model.mkdir()
    config = RunConfig.from_flat(
        {
            "method": "es",
            "perturbation": "lora",
            "model": str(model),
            "train_file": "x.parquet",
            "output_dir": str(tmp_path / "out"),
            "reward_func_path": "engine.rewards.conciseness.compute_score",
        }
    )
    with pytest.raises(ValueError, match=r"model: no safetensors weights in .*lora mode"):
        LoraPopulation(config, model)


def test_worker_draws_each_seed_once_and_keeps_them_for_the_update():
    """lora_slots.SeedFactors: a pair's seed is drawn once, and the update finds the step's
    factors, in its seeds' order, only for its seeds and under the same spec."""
    from engine.backends.vllm.lora_slots import SeedFactors, lora_update_spec

    spec = lora_update_spec([DOWN1], 2, {1: 0.5})
    other = lora_update_spec([DOWN1], 2, {1: 0.25})
    cache = SeedFactors()
    current = cache.take(TABLE, [3, 3, 4], spec)
    assert cache.index == {3: 0, 4: 1} and current[DOWN1.name][0].shape == (2, 2, 12)
    expected = lora.unit_factors(TABLE, [3, 4], [DOWN1], 2, {1: 0.5})[DOWN1.name]
    assert all(torch.equal(x, y) for x, y in zip(current[DOWN1.name], expected, strict=True))
    update = cache.for_update([4, 3], spec)
    assert update is not None
    assert all(torch.equal(x, y.flip(0)) for x, y in zip(update[DOWN1.name], expected, strict=True))
    assert cache.for_update([5], spec) is None and cache.for_update([3], other) is None
    assert list(cache.take(TABLE, [6], other)[DOWN1.name][0].shape) == [1, 2, 12]
    assert cache.for_update([3], spec) is None
