"""Evaluation on the eval set, as the eval strategy asks for it."""

from __future__ import annotations

import time
from collections.abc import Mapping

import numpy as np

from engine import metrics as mk
from engine.alignment.aligner import Aligner
from engine.backends.pool import EnginePool
from engine.config import RunConfig
from engine.data.datasets import Example
from engine.scoring.sources import RewardSources
from engine.sink import StepReport
from engine.tasks import GenerateAndScore, SamplingSpec
from engine.trainer.reporting import (
    completion_metrics,
    finite,
    part_means,
    reward_stats,
    sample_records,
)


def evaluate(
    config: RunConfig,
    pool: EnginePool,
    eval_set: list[Example],
    step: int,
    aligner: Aligner | None = None,
    eval_parts: Mapping[str, range] | None = None,
) -> StepReport:
    """Greedy, one completion per prompt, the unperturbed model, the whole eval set; with
    `aligner`, also the alignment objective at its current lambda; with `eval_parts` (the
    run's eval_sets as rows of `eval_set`), each set's pass@1 and their mean."""
    start = time.perf_counter()
    task = GenerateAndScore(
        prompts=[e.prompt for e in eval_set],
        reward_func_args=[e.reward_func_args for e in eval_set],
        reward_func_path=config.reward.reward_func_path,
        sampling=SamplingSpec(
            n=1, temperature=0.0, max_tokens=config.sampling.max_tokens, seed=config.data.seed
        ),
        description=f"evaluation at step {step}",
        sources=RewardSources.from_config(config),
        reward_limit=config.reward.limit(),
    )
    result = task(pool)
    runtime = time.perf_counter() - start
    metrics = {
        **reward_stats(mk.EVAL, "reward", result.rewards.reshape(-1)),
        **part_means(mk.EVAL, [result]),
        **completion_metrics(mk.EVAL, [result]),
        **(aligner.eval_metrics(result) if aligner is not None else {}),
        **eval_set_metrics(result.rewards.reshape(len(eval_set), -1), eval_parts or {}),
        mk.EVAL_RUNTIME: runtime,
        mk.EVAL_SAMPLES_PER_SECOND: result.rewards.size / runtime,
        mk.EVAL_TOTAL_SAMPLES: float(result.rewards.size),
    }
    return StepReport(
        step=step,
        metrics=finite(metrics),
        samples=sample_records(mk.EVAL, eval_set, result, member=None),
    )


def eval_set_metrics(rewards: np.ndarray, parts: Mapping[str, range]) -> dict[str, float]:
    """`eval/<set>/pass@1/mean` for each set, the mean over its prompts of their mean reward
    (`rewards` is prompts x completions), and `eval/avgpass@1/mean`, the plain mean of the
    sets' values, as ES at Scale's eval_step computes them; nothing without sets."""
    per_prompt = rewards.mean(axis=1)
    per_set = {
        name: float(per_prompt[rows.start : rows.stop].mean()) for name, rows in parts.items()
    }
    if not per_set:
        return {}
    return {
        **{mk.eval_set_key(name): value for name, value in per_set.items()},
        mk.EVAL_SETS_MEAN: float(np.mean(list(per_set.values()))),
    }
