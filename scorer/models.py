"""One scoring model: a Hugging Face sequence-classification checkpoint, a Safe-RLHF score
model (`LlamaForScore`, the alignment fork's beaver reward and cost models; scorer/score_head.py),
or an Open-Assistant reward model (`gpt_neox_reward_model`, the ensembles paper's reward models;
scorer/pooled_reward.py), given by path.

A classifier with one label gives its logit as the score (the usual reward-model head); one
with two labels gives logit[1] - logit[0], the log-odds of label 1, so a classifier trained
with label 1 = helpful (reward) or label 1 = harmful (cost) scores above 0 exactly when it
leans to label 1. For a cost model that is the Safe-RLHF convention: cost > 0 means unsafe,
which a Safe-RLHF score model's end score follows by itself.

What the model reads is its input format: `pair` (ES Lab's default models) tokenizes prompt
and response as the tokenizer's two segments; `conversation` scores the reference's text,
"BEGINNING OF CONVERSATION: USER: {prompt} ASSISTANT:{response}" + end-of-sequence
(scorer/conversation.py), as Safe-RLHF-style reward and cost models expect; `prompter` the
Open-Assistant text "<|prompter|>{prompt}<|endoftext|><|assistant|>{response}<|endoftext|>",
as the ensembles paper's reward models were trained on. Texts longer
than `max_length` tokens (the reference's 512) are truncated.

Decoder classifiers (GPT-2, Llama, ...) often ship without a padding token, and their
config without `pad_token_id`, which a batch of more than one needs (the model scores each
row's last token that is not padding). They pad with their end-of-sequence token, as
Hugging Face's own classifier training does.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np

from scorer.conversation import REFERENCE_EOS, conversation_text, user_words
from scorer.pooled_reward import PooledRewardHead, is_pooled_reward_model, prompter_text
from scorer.score_head import ScoreHead, is_score_model

INPUT_FORMATS = ("pair", "conversation", "prompter")
HEADS = (ScoreHead, PooledRewardHead)  # checkpoints whose head is read apart from the body
DEFAULT_MAX_LENGTH = 512  # the reference's MAX_LENGTH (Safe-RLHF's Beaver models)
UNBOUNDED = 10**6  # tokenizers without a known limit say VERY_LARGE_INTEGER


class ScoringModelError(Exception):
    """A checkpoint that cannot be loaded or used for scoring."""


class ScoringModel:
    """Scores (prompt, response) pairs in micro-batches; safe to call from several threads."""

    def __init__(
        self,
        path: str | Path,
        *,
        max_length: int = DEFAULT_MAX_LENGTH,
        batch_size: int = 32,
        input_format: str = "pair",
    ) -> None:
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        self.path = str(path)
        if input_format not in INPUT_FORMATS:
            raise ScoringModelError(
                f"input format {input_format!r} is not one of {', '.join(INPUT_FORMATS)}"
            )
        if max_length < 1 or batch_size < 1:
            raise ScoringModelError(
                f"max_length and batch_size must be at least 1, got {max_length} and {batch_size}"
            )
        if not (Path(path) / "config.json").is_file():
            raise ScoringModelError(
                f"scoring model {path} is not a Hugging Face checkpoint "
                "folder (no config.json); run `eslab scorer "
                "train-default` or pass another --reward-model/--cost-model"
            )
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(self.path)
            if is_score_model(self.path):
                self.model: Any = ScoreHead(self.path)
            elif is_pooled_reward_model(self.path):
                self.model = PooledRewardHead(self.path)
            else:
                self.model = AutoModelForSequenceClassification.from_pretrained(self.path).eval()
        except (OSError, ValueError) as exc:
            raise ScoringModelError(f"cannot load scoring model {path}: {exc}") from exc
        labels = getattr(self.model.config, "num_labels", 1)
        if not isinstance(self.model, HEADS) and labels not in (1, 2):
            raise ScoringModelError(
                f"scoring model {path} has {labels} labels; a reward or "
                "cost model needs 1 (a score) or 2 (log-odds of label 1)"
            )
        _set_padding(self.tokenizer, self.model.config, self.path)
        limit = _length_limit(self.tokenizer, self.model.config)
        if limit is not None and max_length > limit:
            raise ScoringModelError(
                f"max_length {max_length} is longer than scoring model {path} reads "
                f"({limit} tokens); pass --max-length {limit} or less"
            )
        self.max_length = max_length
        self.batch_size = batch_size
        self.input_format = input_format
        self.eos = self.tokenizer.eos_token or REFERENCE_EOS
        self._torch = torch
        self._lock = threading.Lock()  # one forward pass at a time: CPU threads are shared

    def score(self, prompts: list[str], responses: list[str]) -> list[float]:
        out: list[float] = []
        for start in range(0, len(prompts), self.batch_size):
            out += self._score_batch(
                prompts[start : start + self.batch_size], responses[start : start + self.batch_size]
            )
        return out

    def _score_batch(self, prompts: list[str], responses: list[str]) -> list[float]:
        encoded = self.tokenizer(
            *self._inputs(prompts, responses),
            padding=True,
            truncation=True,
            max_length=self.max_length,
            return_tensors="pt",
        )
        with self._lock, self._torch.inference_mode():
            if isinstance(self.model, HEADS):
                scores = self.model.scores(encoded)
            else:
                logits = self.model(**encoded).logits.float().numpy()  # [B, labels]
                scores = logits[:, 0] if logits.shape[1] == 1 else logits[:, 1] - logits[:, 0]
        return [float(x) for x in np.asarray(scores)]

    def _inputs(self, prompts: list[str], responses: list[str]) -> tuple[list[str], ...]:
        """The tokenizer's text arguments: one text each (prompter, conversation), or (prompts,
        responses) as two segments, truncated longest-first so a long prompt cannot crowd
        the response out entirely."""
        if self.input_format == "prompter":
            return ([prompter_text(p, r) for p, r in zip(prompts, responses, strict=True)],)
        if self.input_format == "conversation":
            return (
                [
                    conversation_text(p, r, self.eos)
                    for p, r in zip(prompts, responses, strict=True)
                ],
            )
        return ([user_words(p) for p in prompts], responses)


def _set_padding(tokenizer: Any, config: Any, path: str) -> None:
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ScoringModelError(
                f"scoring model {path}: its tokenizer has neither a padding nor an "
                "end-of-sequence token to pad batches with"
            )
        tokenizer.pad_token = tokenizer.eos_token
    if getattr(config, "pad_token_id", None) is None:
        config.pad_token_id = tokenizer.pad_token_id


def _length_limit(tokenizer: Any, config: Any) -> int | None:
    """Tokens the model can read: the tokenizer's limit, else the position table's size."""
    if 0 < tokenizer.model_max_length < UNBOUNDED:
        return int(tokenizer.model_max_length)
    positions = getattr(config, "max_position_embeddings", None)
    return int(positions) if isinstance(positions, int) and positions > 0 else None
