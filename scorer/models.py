"""One scoring model: a Hugging Face sequence-classification checkpoint given by path.

A checkpoint with one label gives its logit as the score (the usual reward-model head); one
with two labels gives logit[1] - logit[0], the log-odds of label 1, so a classifier trained
with label 1 = helpful (reward) or label 1 = harmful (cost) scores above 0 exactly when it
leans to label 1. For a cost model that is the Safe-RLHF convention: cost > 0 means unsafe.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np


class ScoringModelError(Exception):
    """A checkpoint that cannot be loaded or used for scoring."""


class ScoringModel:
    """Scores (prompt, response) pairs in micro-batches; safe to call from several threads."""

    def __init__(self, path: str | Path, *, max_length: int = 256, batch_size: int = 32) -> None:
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        self.path = str(path)
        if not (Path(path) / "config.json").is_file():
            raise ScoringModelError(
                f"scoring model {path} is not a Hugging Face checkpoint "
                "folder (no config.json); run `eslab scorer "
                "train-default` or pass another --reward-model/--cost-model"
            )
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(self.path)
            self.model = AutoModelForSequenceClassification.from_pretrained(self.path).eval()
        except (OSError, ValueError) as exc:
            raise ScoringModelError(f"cannot load scoring model {path}: {exc}") from exc
        labels = self.model.config.num_labels
        if labels not in (1, 2):
            raise ScoringModelError(
                f"scoring model {path} has {labels} labels; a reward or "
                "cost model needs 1 (a score) or 2 (log-odds of label 1)"
            )
        self.max_length = max_length
        self.batch_size = batch_size
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
        # longest_first trims whichever of prompt and response is longer, so a long prompt
        # cannot crowd the response out entirely.
        encoded = self.tokenizer(
            prompts,
            responses,
            padding=True,
            truncation="longest_first",
            max_length=self.max_length,
            return_tensors="pt",
        )
        with self._lock, self._torch.inference_mode():
            logits = self.model(**encoded).logits.float().numpy()  # [B, labels]
        scores = logits[:, 0] if logits.shape[1] == 1 else logits[:, 1] - logits[:, 0]
        return [float(x) for x in np.asarray(scores)]
