"""Low-rank members (engine.lowrank.factors): seeded factors, antithetic sign, per-layer
scaling, the update math, and the adapter files. Hand-sized shapes; no engine."""

from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors.torch import load_file

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


def test_factors_are_seeded_per_member_and_target():
    a, b = lora.member_factors(5, Q0, 2)
    assert a.shape == (2, 8) and b.shape == (8, 2) and a.dtype == torch.float32
    again = lora.member_factors(5, Q0, 2)
    assert torch.equal(a, again[0]) and torch.equal(b, again[1])
    assert not torch.equal(a, lora.member_factors(6, Q0, 2)[0])
    other = LoraTarget("model.layers.1.self_attn.q_proj", 1, "q_proj", 8, 8)
    assert not torch.equal(a, lora.member_factors(5, other, 2)[0])


def test_antithetic_members_differ_only_in_sign_and_scale_by_layer():
    a_plus, b_plus = lora.perturbation(5, +0.1, Q0, 2, layer_scale=0.5)
    a_minus, b_minus = lora.perturbation(5, -0.1, Q0, 2, layer_scale=0.5)
    assert torch.equal(a_plus, a_minus) and torch.equal(b_plus, -b_minus)
    a, b = lora.member_factors(5, Q0, 2)
    expected = 0.1 * 0.5 / math.sqrt(2) * (b @ a)
    torch.testing.assert_close(b_plus @ a_plus, expected)


def test_layer_scales_are_mean_abs_of_the_layer_targets():
    weights = {
        "model.layers.0.self_attn.q_proj.weight": torch.full((8, 8), -2.0),
        "model.layers.0.mlp.down_proj.weight": torch.full((8, 12), 4.0),
    }
    targets = [Q0, LoraTarget("model.layers.0.mlp.down_proj", 0, "down_proj", 12, 8)]
    assert lora.layer_scales(weights, targets, "layer") == {0: 3.0}
    assert lora.layer_scales(weights, targets, "none") == {0: 1.0}


def test_dense_update_is_the_weighted_sum_of_low_rank_products():
    seeds, coefficients = [3, 4], [0.5, -2.0]
    expected = torch.zeros(8, 12)
    for seed, c in zip(seeds, coefficients, strict=True):
        a, b = lora.member_factors(seed, DOWN1, 3)
        expected += c * 0.25 / math.sqrt(3) * (b @ a)
    got = lora.dense_update(seeds, coefficients, DOWN1, 3, layer_scale=0.25)
    torch.testing.assert_close(got, expected)
    assert torch.count_nonzero(lora.dense_update([], [], DOWN1, 3, 1.0)) == 0


def test_trained_adapter_keeps_the_best_rank_r_approximation():
    adapter = lora.TrainedAdapter([DOWN1], rank=2)
    scales = {1: 1.0}
    adapter.add([3], [0.7], scales)  # one rank-2 term: kept exactly
    torch.testing.assert_close(
        adapter.delta(DOWN1.name), lora.dense_update([3], [0.7], DOWN1, 2, 1.0)
    )
    adapter.add([4, 5], [0.3, -0.2], scales)  # rank 6 in total: truncated to 2
    full = lora.dense_update([3, 4, 5], [0.7, 0.3, -0.2], DOWN1, 2, 1.0)
    u, s, vh = torch.linalg.svd(full)
    best = (u[:, :2] * s[:2]) @ vh[:2]
    torch.testing.assert_close(adapter.delta(DOWN1.name), best, atol=1e-5, rtol=1e-4)
    restored = lora.TrainedAdapter([DOWN1], rank=2)
    restored.load_state(adapter.state())
    assert torch.equal(restored.delta(DOWN1.name), adapter.delta(DOWN1.name))


def test_members_stack_their_seeds_factors_scaled_behind_the_trained_adapter():
    adapter = lora.TrainedAdapter([DOWN1], rank=2)
    adapter.add([3], [0.7], {1: 1.0})
    units = [lora.seed_factors(seed, [DOWN1], 2, {1: 0.5})[DOWN1.name] for seed in (9, 9, 4)]
    a, b = lora.member_stack(units, [-0.1, 0.1, 0.3], adapter.factors[DOWN1.name])
    assert a.shape == (3, 4, 12) and b.shape == (3, 8, 4)
    for m, (seed, scale) in enumerate([(9, -0.1), (9, 0.1), (4, 0.3)]):
        pa, pb = lora.perturbation(seed, scale, DOWN1, 2, 0.5)
        torch.testing.assert_close(b[m] @ a[m], adapter.delta(DOWN1.name) + pb @ pa)
    plain_a, plain_b = lora.member_stack(units, [-0.1, 0.1, 0.3])
    assert torch.equal(plain_b[0], -plain_b[1]) and torch.equal(plain_a[0], plain_a[1])


def test_written_adapter_is_peft_format_and_folds_alpha_into_b(tmp_path):
    a, b = lora.perturbation(5, 0.1, Q0, 2, 1.0)
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
    """lora_engine.SeedFactors: a pair's seed is drawn once, and the update finds the step's
    factors only for its seeds and under the same spec."""
    from engine.backends.vllm.lora_slots import SeedFactors, lora_update_spec

    spec = lora_update_spec([DOWN1], 2, {1: 0.5})
    other = lora_update_spec([DOWN1], 2, {1: 0.25})
    cache = SeedFactors()
    current = cache.take([3, 3, 4], spec)
    assert list(current) == [3, 4]
    expected = lora.seed_factors(3, [DOWN1], 2, {1: 0.5})[DOWN1.name]
    assert all(torch.equal(x, y) for x, y in zip(current[3][DOWN1.name], expected, strict=True))
    assert cache.for_update([4, 3], spec) is current
    assert cache.for_update([5], spec) is None and cache.for_update([3], other) is None
    assert list(cache.take([6], other)) == [6] and cache.for_update([3], spec) is None
