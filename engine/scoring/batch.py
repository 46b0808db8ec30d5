"""A batch of completions with their rewards, and scoring it with one reward function.

Rewards are computed on the completion text only, never on prompt + completion; a reward
function that fails or returns a non-finite value raises (engine.rewards.score_completion).
With a time limit (`reward_timeout_seconds`) they run in a child process that is killed when
one completion takes longer, which stops the run or scores that completion 0
(`reward_timeout_action`; engine/scoring/reward_process.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from engine.rewards import load_reward_function, score_completion
from engine.scoring.reward_process import RewardLimit, score_in_process

if TYPE_CHECKING:
    from engine.backends.base import Completion


@dataclass
class ScoredBatch:
    """Completions of a batch of prompts and their rewards; arrays are [prompts, n]."""

    texts: list[list[str]]
    rewards: np.ndarray
    parts: dict[str, np.ndarray]
    num_tokens: np.ndarray  # completion tokens
    clipped: np.ndarray
    prompt_tokens: np.ndarray  # the prompt's tokens, repeated for each of its samples
    timings: dict[str, float] = field(default_factory=dict)
    token_ids: list[list[tuple[int, ...]]] = field(default_factory=list)
    """The generated token ids [prompts][n] (stop token included), set by the task that
    generated the batch (engine.tasks.GenerateAndScore.score)."""

    @classmethod
    def of(
        cls, outputs: list[list[Completion]], rewards: np.ndarray, parts: dict[str, np.ndarray]
    ) -> ScoredBatch:
        """The batch of `outputs` with the rewards and parts scored for them."""

        def per_sample(value: Callable[[Completion], Any], dtype: type) -> np.ndarray:
            return np.array([[value(c) for c in cs] for cs in outputs], dtype=dtype).reshape(
                rewards.shape
            )

        return cls(
            texts=[[c.text for c in completions] for completions in outputs],
            rewards=rewards,
            parts=parts,
            num_tokens=per_sample(lambda c: c.num_tokens, np.int64),
            clipped=per_sample(lambda c: not c.finished, bool),
            prompt_tokens=per_sample(lambda c: c.prompt_tokens, np.int64),
        )

    @property
    def fitness(self) -> float:
        """ES fitness of a member: its mean reward over every (prompt, sample)."""
        return float(self.rewards.mean())

    @property
    def total_tokens(self) -> int:
        """Prompt and completion tokens, a prompt once per sample (nlp-waseda/lbes counts
        `prompt_lengths.sum() * n + completion_lengths.sum()`)."""
        return int(self.prompt_tokens.sum() + self.num_tokens.sum())


def score_batch(
    outputs: list[list[Completion]],
    reward_func_args: list[dict[str, Any]],
    reward_func_path: str,
    description: str,
    limit: RewardLimit | None = None,
) -> ScoredBatch:
    """`limit` None scores in this process, with no time limit."""
    num_prompts, n = len(outputs), len(outputs[0]) if outputs else 0
    items = [
        (completion.text, args, f"{description}, prompt {b} sample {j}")
        for b, (completions, args) in enumerate(zip(outputs, reward_func_args, strict=True))
        for j, completion in enumerate(completions)
    ]
    if limit is None:
        func = load_reward_function(reward_func_path)
        scored = [score_completion(func, t, a, sample_description=d) for t, a, d in items]
    else:
        scored = score_in_process(reward_func_path, items, limit)
    rewards = np.zeros((num_prompts, n))
    parts: dict[str, np.ndarray] = {}
    for i, scores in enumerate(scored):
        b, j = divmod(i, n)
        rewards[b, j] = scores.pop("reward")
        for name, value in scores.items():
            parts.setdefault(name, np.full((num_prompts, n), np.nan))[b, j] = value
    return ScoredBatch.of(outputs, rewards, parts)
