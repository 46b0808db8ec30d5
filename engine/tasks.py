"""What an engine does for one population member (or for the unperturbed model).

Tasks are small picklable objects: the pool sends them to whichever engine is free (a Ray
actor when there are several), they run next to the weights, and only texts and scalars come
back — never weights.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engine.backends.base import Completion, PerturbationEngine
from engine.backends.pool import EnginePool
from engine.rewards import load_reward_function, score_completion
from engine.scoring.sources import RewardSources


@dataclass(frozen=True)
class SamplingSpec:
    n: int
    temperature: float
    max_tokens: int
    seed: int


@dataclass
class ScoredBatch:
    """Completions of a batch of prompts and their rewards; arrays are [prompts, n]."""

    texts: list[list[str]]
    rewards: np.ndarray
    parts: dict[str, np.ndarray]
    num_tokens: np.ndarray
    clipped: np.ndarray
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def fitness(self) -> float:
        """ES fitness of a member: its mean reward over every (prompt, sample)."""
        return float(self.rewards.mean())


@dataclass(frozen=True)
class GenerateAndScore:
    """Generate for every prompt and score each completion (on the completion only)."""

    prompts: list[list[dict[str, str]]]
    reward_func_args: list[dict[str, Any]]
    reward_func_path: str | None
    sampling: SamplingSpec
    description: str = "a sample"
    sources: RewardSources | None = None  # scorer / ensemble rewards and costs (alignment)

    def __call__(self, engine: PerturbationEngine | EnginePool) -> ScoredBatch:
        """Runs on a (perturbed) engine, or on the pool for the unperturbed model."""
        start = time.perf_counter()
        outputs = engine.generate(self.prompts, n=self.sampling.n,
                                  temperature=self.sampling.temperature,
                                  max_tokens=self.sampling.max_tokens, seed=self.sampling.seed)
        generated = time.perf_counter()
        batch = self.score(outputs)
        batch.timings = {"generation": generated - start,
                         "reward": time.perf_counter() - generated}
        return batch

    def score(self, outputs: list[list[Completion]]) -> ScoredBatch:
        if self.sources is not None:
            return self.sources.score(outputs, self.prompts, self.reward_func_args,
                                      self.description)
        return score_batch(outputs, self.reward_func_args, self.reward_func_path,
                           self.description)


def score_batch(outputs: list[list[Completion]], reward_func_args: list[dict[str, Any]],
                reward_func_path: str, description: str) -> ScoredBatch:
    func = load_reward_function(reward_func_path)
    num_prompts, n = len(outputs), len(outputs[0]) if outputs else 0
    rewards = np.zeros((num_prompts, n))
    parts: dict[str, np.ndarray] = {}
    for b, (completions, args) in enumerate(zip(outputs, reward_func_args, strict=True)):
        for j, completion in enumerate(completions):
            scores = score_completion(func, completion.text, args,
                                      sample_description=f"{description}, prompt {b} sample {j}")
            rewards[b, j] = scores.pop("reward")
            for name, value in scores.items():
                parts.setdefault(name, np.full((num_prompts, n), np.nan))[b, j] = value
    return ScoredBatch(
        texts=[[c.text for c in completions] for completions in outputs],
        rewards=rewards,
        parts=parts,
        num_tokens=np.array([[c.num_tokens for c in cs] for cs in outputs], dtype=np.int64),
        clipped=np.array([[not c.finished for c in cs] for cs in outputs], dtype=bool),
    )


@dataclass(frozen=True)
class CompletionLogprobs:
    """Mean log-likelihood of fixed completions under the engine's current weights (LBES)."""

    prompts: list[list[dict[str, str]]]
    completions: list[str]

    def __call__(self, engine: PerturbationEngine) -> np.ndarray:
        return np.asarray(engine.completion_logprobs(self.prompts, self.completions))
