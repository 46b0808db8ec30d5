"""Mapping vLLM's fused parameters back to a Hugging Face checkpoint (no vLLM needed)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.backends.vllm import hf_export

FUSED = {
    "model.layers.0.self_attn.qkv_proj": (["q_proj", "k_proj", "v_proj"], [4, 2, 2]),
    "model.layers.0.mlp.gate_up_proj": (["gate_proj", "up_proj"], [6, 6]),
}


def vllm_params() -> dict[str, torch.Tensor]:
    return {
        "model.embed_tokens.weight": torch.arange(12 * 3, dtype=torch.float32).view(12, 3),
        "model.layers.0.self_attn.qkv_proj.weight": torch.arange(8 * 3.0).view(8, 3),
        "model.layers.0.mlp.gate_up_proj.weight": torch.arange(12 * 3.0).view(12, 3),
        "model.norm.weight": torch.ones(3),
    }


def test_unfuse_splits_along_the_output_dimension():
    out = hf_export.unfuse(vllm_params(), FUSED)
    qkv = vllm_params()["model.layers.0.self_attn.qkv_proj.weight"]
    assert torch.equal(out["model.layers.0.self_attn.q_proj.weight"], qkv[:4])
    assert torch.equal(out["model.layers.0.self_attn.k_proj.weight"], qkv[4:6])
    assert torch.equal(out["model.layers.0.self_attn.v_proj.weight"], qkv[6:])
    assert torch.equal(out["model.layers.0.mlp.up_proj.weight"], torch.arange(18, 36.0).view(6, 3))
    assert "model.layers.0.self_attn.qkv_proj.weight" not in out
    assert "model.norm.weight" in out


def test_unfuse_refuses_wrong_sizes():
    bad = {"model.layers.0.self_attn.qkv_proj": (["q_proj", "k_proj", "v_proj"], [4, 2, 3])}
    with pytest.raises(hf_export.ExportError, match="sizes"):
        hf_export.unfuse(vllm_params(), bad)


def source_specs(vocab: int = 10, tied_lm_head: bool = False):
    specs = {
        "model.embed_tokens.weight": ((vocab, 3), "BF16"),
        "model.layers.0.self_attn.q_proj.weight": ((4, 3), "BF16"),
        "model.layers.0.self_attn.k_proj.weight": ((2, 3), "BF16"),
        "model.layers.0.self_attn.v_proj.weight": ((2, 3), "BF16"),
        "model.layers.0.mlp.gate_proj.weight": ((6, 3), "BF16"),
        "model.layers.0.mlp.up_proj.weight": ((6, 3), "BF16"),
        "model.norm.weight": ((3,), "BF16"),
    }
    if tied_lm_head:
        specs["lm_head.weight"] = ((vocab, 3), "BF16")
    return specs


def test_match_source_drops_vocab_padding_and_casts():
    tensors = hf_export.unfuse(vllm_params(), FUSED)  # vLLM padded the vocab to 12 rows
    out = hf_export.match_source(tensors, source_specs(vocab=10), tied_embeddings=True)
    assert out["model.embed_tokens.weight"].shape == (10, 3)
    assert all(t.dtype == torch.bfloat16 for t in out.values())


def test_match_source_restores_a_deduplicated_tied_lm_head():
    tensors = hf_export.unfuse(vllm_params(), FUSED)
    out = hf_export.match_source(tensors, source_specs(12, tied_lm_head=True), tied_embeddings=True)
    assert torch.equal(out["lm_head.weight"], out["model.embed_tokens.weight"])


def test_match_source_names_what_it_cannot_map():
    tensors = hf_export.unfuse(vllm_params(), {})  # fused names left as they are
    with pytest.raises(hf_export.ExportError, match="qkv_proj"):
        hf_export.match_source(tensors, source_specs(12), tied_embeddings=True)


def test_write_hf_folder_copies_non_weight_files(tmp_path):
    source = tmp_path / "src"
    source.mkdir()
    (source / "config.json").write_text(json.dumps({"tie_word_embeddings": True}))
    (source / "tokenizer.json").write_text("{}")
    (source / "eslab-manifest.json").write_text("{}")
    save_file({"x": torch.zeros(2)}, str(source / "model.safetensors"))
    target = hf_export.write_hf_folder({"x": torch.ones(2)}, source, tmp_path / "out")
    assert sorted(p.name for p in target.iterdir()) == [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
    ]
    assert torch.equal(load_file(str(target / "model.safetensors"))["x"], torch.ones(2))
    assert hf_export.tied_word_embeddings(source)
    assert hf_export.source_tensor_specs(source) == {"x": ((2,), "F32")}
