"""One LBES step (nlp-waseda/lbes `lbes_trainer.py`): the unperturbed model samples n
completions per prompt, the filters keep the informative ones, and a member's fitness is the
correlation between those rewards and its log-likelihood of the samples; the update is ES's."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from engine import metrics as mk
from engine.backends.base import EvaluationStopped
from engine.backends.pool import EnginePool
from engine.config import RunConfig
from engine.data.datasets import Example
from engine.es import population
from engine.fitness import shape_fitness
from engine.lbes import filter_rewards, member_correlations, reference_tiebreak
from engine.sink import StepReport
from engine.slot_population import SlotPopulation
from engine.tasks import CompletionLogprobs
from engine.trainer.es_step import apply_update, generate_task
from engine.trainer.reporting import (
    completion_metrics,
    phase_timings,
    population_records,
    sample_records,
    train_score_metrics,
)


def lbes_step(
    config: RunConfig,
    pool: EnginePool,
    examples: list[Example],
    step: int,
    noise_std: float,
    learning_rate: float,
    stop: Callable[[], bool] | None = None,
    slots: SlotPopulation | None = None,
) -> StepReport | None:
    """None when no sample survives the filters: the step is skipped. With `slots` the
    members are held in the engines' adapter slots and scored in one call."""
    base_start = time.perf_counter()
    base = generate_task(config, examples, step, description=f"step {step + 1} (base model)")(pool)
    base_seconds = time.perf_counter() - base_start
    kept = filter_rewards(base.rewards, config.lbes, reference_tiebreak(config.data.seed, step))
    if kept.is_empty:
        return None

    members = population(config.data.seed, step, config.es.population_size, config.es.antithetic)
    rows = np.argwhere(kept.kept)  # [K, 2]: (prompt, sample) of every kept sample
    task = CompletionLogprobs(
        prompts=[examples[b].prompt for b, _ in rows],
        completions=[base.token_ids[b][j] for b, j in rows],
    )
    logprob_start = time.perf_counter()
    if slots is None:
        per_member = pool.evaluate([(m.seed, m.sign * noise_std) for m in members], task, stop=stop)
    else:
        if stop is not None and stop():
            raise EvaluationStopped("stopped before the population was evaluated")
        per_member = slots.log_likelihoods(pool, members, noise_std, task, step)
    logprob_seconds = time.perf_counter() - logprob_start
    logliks = np.full((len(members), *base.rewards.shape), np.nan)  # [N, B, n]
    for i, values in enumerate(per_member):
        logliks[i, rows[:, 0], rows[:, 1]] = values
    correlations = member_correlations(
        base.rewards, logliks, kept.kept, flat=config.lbes.flat_corrcoef
    )
    shaped = shape_fitness(config.es.fitness_shaping, correlations)
    update_seconds = apply_update(pool, members, shaped, learning_rate, noise_std, slots)

    metrics = {
        # "std" is across a prompt's n samples in LBES
        **train_score_metrics(base.rewards, base.parts, axis=1),
        **completion_metrics(mk.TRAIN, [base]),
        **phase_timings(pool),
        mk.RETAINED_PROMPT_RATIO: kept.retained_prompt_ratio,
        mk.RETAINED_REWARD_RATIO: kept.retained_reward_ratio,
        mk.CORRELATION_MEAN: float(np.nanmean(correlations))
        if np.isfinite(correlations).any()
        else float("nan"),
        mk.time_key("generation"): base_seconds,
        mk.time_key("reward"): base.timings["reward"],
        mk.time_key("logprobs"): logprob_seconds,
        mk.time_key("update"): update_seconds,
    }
    mean_loglik = np.full(base.rewards.shape, np.nan)  # [B, n]: population mean, kept only
    mean_loglik[kept.kept] = logliks[:, kept.kept].mean(axis=0)
    samples = sample_records(
        mk.TRAIN,
        examples,
        base,
        member=None,
        kept=kept.kept,
        dropped_by=kept.dropped_by,
        logprob=mean_loglik,
    )
    return StepReport(
        step=step + 1,
        metrics=metrics,
        population=population_records(members, correlations, shaped),
        samples=samples,
        num_tokens=base.total_tokens,
        num_samples=base.rewards.size,
    )
