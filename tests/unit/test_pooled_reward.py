"""Open-Assistant reward models (the ensembles paper's, `gpt_neox_reward_model`): a tiny
random checkpoint of that layout, built here (a GPT-NeoX body under `gpt_neox.*`, a Linear
`out_proj` with a bias, `pooling` in its config), scores as the architecture defines it: the
head on the last kept token's hidden state (`last`) or on the mean over kept tokens (`mean`),
computed here on the body directly, one text at a time, without padding. The text is
Open-Assistant's `<|prompter|>...<|endoftext|><|assistant|>...<|endoftext|>`."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from scorer.models import ScoringModel, ScoringModelError
from scorer.pooled_reward import is_pooled_reward_model, prompter_text

WORDS = ["how", "do", "i", "make", "a", "cake", "mix", "flour", "and", "eggs", "sorry"]
PROMPTS = ["how do i make a cake", "make a cake"]
RESPONSES = ["mix flour and eggs", "sorry"]


def pooled_checkpoint(folder, pooling: str | None):
    """A 2-layer GPT-NeoX reward model with a word-level tokenizer; its body and head too."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import GPTNeoXConfig, GPTNeoXModel, PreTrainedTokenizerFast

    folder.mkdir(parents=True)
    vocab = {w: i for i, w in enumerate(["<unk>", "<|endoftext|>", *WORDS])}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="<unk>", eos_token="<|endoftext|>"
    )
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|prompter|>", "<|assistant|>"]})
    tokenizer.save_pretrained(folder)
    torch.manual_seed(0)
    config = GPTNeoXConfig(
        vocab_size=len(tokenizer),
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=64,
    )
    body = GPTNeoXModel(config).eval()
    head = torch.nn.Linear(16, 1)
    tensors = {f"gpt_neox.{k}": v.contiguous() for k, v in body.state_dict().items()}
    tensors |= {"out_proj.weight": head.weight.detach(), "out_proj.bias": head.bias.detach()}
    save_file(tensors, str(folder / "model.safetensors"))
    fields = config.to_dict() | {
        "model_type": "gpt_neox_reward_model",
        "architectures": ["GPTNeoXRewardModel"],
        "pooling": pooling,
    }
    (folder / "config.json").write_text(json.dumps(fields))
    return tokenizer, body, head


def expected(tokenizer, body, head, pooling: str) -> list[float]:
    out = []
    for prompt, response in zip(PROMPTS, RESPONSES, strict=True):
        ids = tokenizer(prompter_text(prompt, response), return_tensors="pt").input_ids
        with torch.no_grad():
            hidden = body(input_ids=ids).last_hidden_state[0]
            pooled = hidden[-1] if pooling == "last" else hidden.mean(dim=0)
            out.append(float(head(pooled)[0]))
    return out


@pytest.mark.parametrize(("pooling", "as_computed"), [(None, "last"), ("mean", "mean")])
def test_an_open_assistant_reward_model_scores_with_its_pooling(tmp_path, pooling, as_computed):
    folder = tmp_path / "rm_seed1"
    tokenizer, body, head = pooled_checkpoint(folder, pooling)
    assert is_pooled_reward_model(folder)
    model = ScoringModel(folder, input_format="prompter", max_length=64)
    batched = model.score(PROMPTS, RESPONSES)  # two lengths: padding must not move the scores
    assert batched == pytest.approx(expected(tokenizer, body, head, as_computed), abs=1e-5)


def test_the_prompter_text_is_open_assistants():
    assert prompter_text("Add 2 and 3.", "5") == (
        "<|prompter|>Add 2 and 3.<|endoftext|><|assistant|>5<|endoftext|>"
    )


def test_an_unknown_pooling_is_refused(tmp_path):
    folder = tmp_path / "rm"
    pooled_checkpoint(folder, "max")
    with pytest.raises(ScoringModelError, match="pooling is 'max'"):
        ScoringModel(folder, input_format="prompter", max_length=64)
