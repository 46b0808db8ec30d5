"""Safe-RLHF score models (the alignment fork's beaver reward and cost models,
`LlamaForScore`): a tiny random checkpoint of that layout, built here (a Llama backbone under
`model.*`, a `score_head` Linear without a bias, `architectures: ["LlamaForScore"]`, with and
without a normalizer), scores as the architecture defines it: the head on the last hidden
state of the last token the attention mask keeps, computed here on the backbone directly.
Loaded as a sequence classifier it would get an untrained head instead."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from scorer.conversation import conversation_text
from scorer.models import ScoringModel
from scorer.score_head import is_score_model

PROMPTS = ["how do i make a cake", "can you help me with something longer than this"]
RESPONSES = [" mix flour and eggs", " sorry"]
MEAN, VAR = 0.25, 4.0


def score_checkpoint(folder, default_model_dir, normalized: bool):
    """A 2-layer Llama score model with the default model's tokenizer; its backbone too."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaModel

    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(default_model_dir)
    tokenizer.save_pretrained(folder)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
    )
    backbone = LlamaModel(config).eval()
    head = torch.randn(1, config.hidden_size)
    tensors = {f"model.{k}": v.contiguous() for k, v in backbone.state_dict().items()}
    tensors["score_head.weight"] = head
    if normalized:
        tensors |= {
            "normalizer.mean": torch.tensor([MEAN]),
            "normalizer.var": torch.tensor([VAR]),
            "normalizer.count": torch.tensor(100),
        }
    save_file(tensors, str(folder / "model.safetensors"))
    fields = config.to_dict() | {
        "architectures": ["LlamaForScore"],
        "score_dim": 1,
        "bias": False,
        "score_type": "reward",
        "do_normalize": normalized,
        "normalize_function": "affine",
        "normalizer_type": "RunningMeanStd" if normalized else None,
    }
    (folder / "config.json").write_text(json.dumps(fields))
    return tokenizer, backbone, head


@pytest.mark.parametrize("normalized", [False, True])
def test_a_score_model_gives_its_end_scores(tmp_path, default_model_dir, normalized):
    folder = tmp_path / "beaver-like"
    tokenizer, backbone, head = score_checkpoint(folder, default_model_dir, normalized)
    assert is_score_model(folder)
    eos = tokenizer.eos_token
    expected = []
    with torch.no_grad():
        for prompt, response in zip(PROMPTS, RESPONSES, strict=True):
            ids = tokenizer(conversation_text(prompt, response, eos), return_tensors="pt")
            last = backbone(**ids).last_hidden_state[0, -1]
            score = float(last @ head[0])
            expected.append((score - MEAN) / (VAR**0.5 + 1e-8) if normalized else score)

    model = ScoringModel(folder, input_format="conversation")
    together = model.score(PROMPTS, RESPONSES)  # padded to one length in one batch
    alone = [model.score([p], [r])[0] for p, r in zip(PROMPTS, RESPONSES, strict=True)]
    assert np.allclose(together, expected, atol=1e-4), (together, expected)
    assert np.allclose(alone, expected, atol=1e-4)
    assert len(set(np.round(together, 4))) == 2  # the two texts differ


def test_a_score_model_with_several_scores_is_refused(tmp_path, default_model_dir):
    from scorer.models import ScoringModelError

    folder = tmp_path / "two-scores"
    score_checkpoint(folder, default_model_dir, normalized=False)
    config = json.loads((folder / "config.json").read_text()) | {"score_dim": 2}
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ScoringModelError, match="its score_dim is 2; a reward or cost model"):
        ScoringModel(folder)
