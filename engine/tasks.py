"""What an engine does for one population member (or for the unperturbed model).

Tasks are small picklable objects: the pool sends them to whichever engine is free (a Ray
actor when there are several), they run next to the weights, and only texts and scalars come
back — never weights.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.backends.base import Completion, PerturbationEngine
from engine.backends.pool import EnginePool
from engine.prompts import Prompt
from engine.scoring.batch import ScoredBatch, score_batch
from engine.scoring.reward_process import RewardLimit
from engine.scoring.sources import RewardSources


@dataclass(frozen=True)
class SamplingSpec:
    n: int
    temperature: float
    max_tokens: int
    seed: int


@dataclass(frozen=True)
class GenerateAndScore:
    """Generate for every prompt and score each completion (on the completion only)."""

    prompts: list[Prompt]
    reward_func_args: list[dict[str, Any]]
    reward_func_path: str | None
    sampling: SamplingSpec
    description: str = "a sample"
    sources: RewardSources | None = None  # scorer / ensemble rewards and costs (alignment)
    reward_limit: RewardLimit | None = None  # for the reward function (None: no limit)

    def __call__(self, engine: PerturbationEngine | EnginePool) -> ScoredBatch:
        """Runs on a (perturbed) engine, or on the pool for the unperturbed model."""
        start = time.perf_counter()
        outputs = engine.generate(
            self.prompts,
            n=self.sampling.n,
            temperature=self.sampling.temperature,
            max_tokens=self.sampling.max_tokens,
            seed=self.sampling.seed,
        )
        generated = time.perf_counter()
        batch = self.score(outputs)
        batch.timings = {"generation": generated - start, "reward": time.perf_counter() - generated}
        return batch

    def score(self, outputs: list[list[Completion]]) -> ScoredBatch:
        """Rewards of `outputs`; the batch keeps their generated token ids (LBES scores them)."""
        if self.sources is not None:
            batch = self.sources.score(
                outputs, self.prompts, self.reward_func_args, self.description
            )
        else:
            batch = score_batch(
                outputs,
                self.reward_func_args,
                self.reward_func_path,
                self.description,
                self.reward_limit,
            )
        batch.token_ids = [[tuple(c.token_ids) for c in cs] for cs in outputs]
        return batch


@dataclass(frozen=True)
class CompletionLogprobs:
    """Mean log-likelihood of fixed completions under the engine's current weights (LBES).

    Completions are the token ids the base model generated, stop token included, as
    nlp-waseda/lbes `src/llm_actor.py` (`calc_mean_logprobs`) scores them: decoding them to
    text and tokenizing again may split the text differently, and an answer of the stop token
    alone decodes to no text at all.
    """

    prompts: list[Prompt]
    completions: list[tuple[int, ...]]

    def __call__(self, engine: PerturbationEngine) -> np.ndarray:
        return np.asarray(engine.completion_logprobs(self.prompts, self.completions))
