"""The linear layers the CPU benchmarks measure alone (bench/model_costs.py): the shapes vLLM
serves, read from a model folder."""

from __future__ import annotations

import json

import torch
from safetensors.torch import save_file

from bench.model_costs import linear_shapes


def test_the_default_models_layers_are_fused_as_vllm_serves_them(default_model_dir):
    shapes, config = linear_shapes(str(default_model_dir))
    layers, hidden = config["num_hidden_layers"], config["hidden_size"]
    assert len(shapes) == 4 * layers + 1  # qkv, o, gate_up, down a layer; the vocabulary
    assert shapes[-1] == (config["vocab_size"], hidden)
    head_dim = hidden // config["num_attention_heads"]
    qkv = hidden + 2 * config["num_key_value_heads"] * head_dim
    intermediate = config["intermediate_size"]
    assert set(shapes[:-1]) == {(qkv, hidden), (hidden, hidden), (2 * intermediate, hidden)} | {
        (hidden, intermediate)
    }


def test_an_untied_vocabulary_projection_is_last_and_counted_once(tmp_path):
    weights = {
        "model.embed_tokens.weight": torch.zeros(10, 4),
        "model.layers.0.self_attn.q_proj.weight": torch.zeros(4, 4),
        "model.layers.0.self_attn.k_proj.weight": torch.zeros(2, 4),
        "model.layers.0.self_attn.v_proj.weight": torch.zeros(2, 4),
        "model.layers.0.mlp.gate_proj.weight": torch.zeros(6, 4),
        "model.layers.0.mlp.up_proj.weight": torch.zeros(6, 4),
        "model.layers.0.mlp.down_proj.weight": torch.zeros(4, 6),
        "model.norm.weight": torch.zeros(4),
        "lm_head.weight": torch.zeros(10, 4),
    }
    save_file(weights, tmp_path / "model.safetensors")
    config = {"vocab_size": 10, "hidden_size": 4, "tie_word_embeddings": False}
    (tmp_path / "config.json").write_text(json.dumps(config))
    shapes, _ = linear_shapes(str(tmp_path))
    assert sorted(shapes[:-1]) == [(4, 6), (8, 4), (12, 4)]
    assert shapes[-1] == (10, 4)
