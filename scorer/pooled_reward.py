"""Open-Assistant reward models, the reward models of tlc4418/llm_optimization (the ensembles
paper): a GPT-NeoX checkpoint whose config's `model_type` is `gpt_neox_reward_model`, its body
under `gpt_neox.*` and a Linear `out_proj` from the hidden size to one score, which reads the
body's last hidden states pooled as the config's `pooling` says: `last`, the last token the
attention mask keeps (the default), or `mean`, the mean over the kept tokens.

Transformers does not know that model type, so AutoModelForSequenceClassification cannot load
such a checkpoint; here the body is loaded as a plain GPT-NeoX model and the head is read from
the checkpoint's own `out_proj.*` tensors (scorer/score_head.py does the same for Safe-RLHF).

Those models were trained on one text per answer, the prompt and answer in Open-Assistant's
tags, `<|prompter|>{prompt}<|endoftext|><|assistant|>{answer}<|endoftext|>`, which the scorer's
`prompter` input format gives them (prompter_text).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from scorer.score_head import extra_tensors

MODEL_TYPE = "gpt_neox_reward_model"
POOLINGS = ("last", "mean")
PROMPTER, ASSISTANT, END = "<|prompter|>", "<|assistant|>", "<|endoftext|>"


def prompter_text(prompt: str, response: str) -> str:
    """One (prompt, answer) pair in Open-Assistant's tags, as its reward models read it."""
    return f"{PROMPTER}{prompt}{END}{ASSISTANT}{response}{END}"


def is_pooled_reward_model(folder: str | Path) -> bool:
    """Whether the checkpoint's config names Open-Assistant's reward model type."""
    try:
        config = json.loads((Path(folder) / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return config.get("model_type") == MODEL_TYPE


class PooledRewardHead:
    """An Open-Assistant reward model: `scores(encoded)` gives each row's score."""

    def __init__(self, folder: str | Path) -> None:
        import torch
        from transformers import GPTNeoXConfig, GPTNeoXModel

        settings = json.loads((Path(folder) / "config.json").read_text())
        self.pooling = settings.get("pooling") or "last"
        if self.pooling not in POOLINGS:
            raise ValueError(f"its pooling is {self.pooling!r}; known: {', '.join(POOLINGS)}")
        settings.pop("model_type", None)
        self.config = GPTNeoXConfig.from_dict(settings)
        self.body = GPTNeoXModel.from_pretrained(str(folder), config=self.config).eval()
        tensors = extra_tensors(Path(folder), ("out_proj.",))
        if "out_proj.weight" not in tensors:
            raise ValueError("its checkpoint has no out_proj.weight (the reward head)")
        self.weight = tensors["out_proj.weight"].float()
        self.bias = tensors.get("out_proj.bias")
        self._torch = torch

    def scores(self, encoded: Any) -> np.ndarray:
        torch = self._torch
        mask = encoded["attention_mask"]
        hidden = self.body(
            input_ids=encoded["input_ids"], attention_mask=mask
        ).last_hidden_state.float()
        if self.pooling == "mean":
            kept = mask.unsqueeze(-1).float()
            pooled = (hidden * kept).sum(dim=1) / kept.sum(dim=1)
        else:
            positions = torch.arange(mask.shape[1]).expand_as(mask)
            end = (positions * mask).argmax(dim=1)  # the last kept token, either padding side
            pooled = hidden[torch.arange(hidden.shape[0]), end]
        scores = pooled @ self.weight.T + (0 if self.bias is None else self.bias.float())
        return scores[:, 0].numpy()
