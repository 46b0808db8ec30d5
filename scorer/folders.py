"""Scoring with reward-model folders in this process, without the HTTP service: what
`eslab bon --proxy-models` does with an ensemble of per-seed reward models, as
tlc4418/llm_optimization scores its best-of-n answers with each seed's model in turn.

One model is in memory at a time, so an ensemble costs the time of its members, not their
summed memory.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

from scorer.models import DEFAULT_MAX_LENGTH, ScoringModel


def score_with_folders(
    folders: Mapping[str, Path],
    prompts: list[str],
    answers: list[list[str]],
    *,
    input_format: str = "pair",
    batch_size: int = 32,
    max_length: int = DEFAULT_MAX_LENGTH,
    log: Callable[[str], None] = print,
) -> dict[str, np.ndarray]:
    """Member name -> scores [prompts, N] of each prompt's answers."""
    pair_prompts = [p for p, texts in zip(prompts, answers, strict=True) for _ in texts]
    responses = [a for texts in answers for a in texts]
    shape = (len(answers), len(answers[0]) if answers else 0)
    scores = {}
    for name, folder in folders.items():
        log(f"best-of-n: scoring {len(responses)} answers with {name} ({folder})")
        model = ScoringModel(
            folder, max_length=max_length, batch_size=batch_size, input_format=input_format
        )
        scores[name] = np.asarray(model.score(pair_prompts, responses)).reshape(shape)
        del model
        gc.collect()
    return scores
