"""One ES step (VsonicV/es-at-scale, nlp-waseda/lbes `es_trainer.py`): a member's fitness
is its mean reward over the batch; the update is

    theta += lr / (N * sigma) * sum_i A_i * eps_i

with A_i the shaped fitness (docs/algorithms.md). The sampling task and the update are
shared with LBES (engine/trainer/lbes_step.py)."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from engine import metrics as mk
from engine.alignment.aligner import Aligner
from engine.backends.base import EvaluationStopped
from engine.backends.pool import EnginePool
from engine.config import RunConfig
from engine.data.datasets import Example
from engine.es import Member, population, update_coefficients, update_terms
from engine.fitness import macro_shape_fitness, shape_fitness
from engine.noise import derive_seed
from engine.scoring.batch import ScoredBatch
from engine.scoring.sources import RewardSources
from engine.sink import StepReport
from engine.slot_population import SlotPopulation
from engine.tasks import GenerateAndScore, SamplingSpec
from engine.trainer.reporting import (
    completion_metrics,
    phase_timings,
    population_records,
    population_reward_stats,
    sample_records,
    stacked_parts,
    train_score_metrics,
)


def es_step(
    config: RunConfig,
    pool: EnginePool,
    examples: list[Example],
    step: int,
    noise_std: float,
    learning_rate: float,
    stop: Callable[[], bool] | None = None,
    slots: SlotPopulation | None = None,
    aligner: Aligner | None = None,
) -> StepReport:
    """One ES step; with `slots` the members are held in the engines' adapter slots and
    evaluated in one call (perturbation lora or full_batched)."""
    members = population(config.data.seed, step, config.es.population_size, config.es.antithetic)
    task = generate_task(config, examples, step, description=f"step {step + 1}")
    if slots is None:
        results: list[ScoredBatch] = pool.evaluate(
            [(m.seed, m.sign * noise_std) for m in members], task, stop=stop
        )
    else:
        if stop is not None and stop():
            raise EvaluationStopped("stopped before the population was evaluated")
        results = slots.evaluate(pool, members, noise_std, task, step)

    mean_rewards = np.array([r.fitness for r in results])  # [N]
    fitness = aligner.fitness(results) if aligner is not None else mean_rewards
    alignment_metrics, base_samples = {}, []
    if aligner is not None:
        # The unperturbed model on the same prompts, before the update, and (as the reference)
        # only when lambda adapts: nothing else reads it.
        base = task(pool) if aligner.adapts else None
        alignment_metrics = {**aligner.adapt(base), **aligner.population_metrics(results, fitness)}
        if base is not None:
            base_samples = sample_records(mk.TRAIN, examples, base, member=None)
    if config.es.macro_advantage:
        shaped = macro_shape_fitness(
            config.es.fitness_shaping, np.stack([r.rewards for r in results])
        )
    else:
        shaped = shape_fitness(config.es.fitness_shaping, fitness)
    update_seconds = apply_update(pool, members, shaped, learning_rate, noise_std, slots)

    metrics = {
        **(slots.metrics() if slots is not None else {}),
        # lbes's spread: each (prompt, sample)'s reward across the population
        **train_score_metrics(
            np.stack([r.rewards for r in results]), stacked_parts(results), axis=0
        ),
        **population_reward_stats(mean_rewards),
        **alignment_metrics,
        **completion_metrics(mk.TRAIN, results),
        **phase_timings(pool),
        mk.time_key("generation"): sum(r.timings["generation"] for r in results),
        mk.time_key("reward"): sum(r.timings["reward"] for r in results),
        mk.time_key("update"): update_seconds,
    }
    best, worst = int(np.argmax(fitness)), int(np.argmin(fitness))
    samples = [
        s
        for i in dict.fromkeys((best, worst))
        for s in sample_records(mk.TRAIN, examples, results[i], member=i)
    ] + base_samples
    records = population_records(members, fitness, shaped)
    if aligner is not None:
        records = aligner.with_scores(records, results)
    return StepReport(
        step=step + 1,
        metrics=metrics,
        population=records,
        samples=samples,
        num_tokens=sum(r.total_tokens for r in results),
        num_samples=sum(r.rewards.size for r in results),
    )


def generate_task(
    config: RunConfig, examples: list[Example], step: int, *, description: str
) -> GenerateAndScore:
    # Every member samples with the same seed: common random numbers, so fitness differences
    # come from the perturbation and not from the sampling noise.
    sampling = SamplingSpec(
        n=config.sampling.n,
        temperature=config.sampling.temperature,
        max_tokens=config.sampling.max_tokens,
        seed=derive_seed(config.data.seed, step, "sampling"),
    )
    return GenerateAndScore(
        prompts=[e.prompt for e in examples],
        reward_func_args=[e.reward_func_args for e in examples],
        reward_func_path=config.reward.reward_func_path,
        sampling=sampling,
        description=description,
        sources=RewardSources.from_config(config),
        reward_limit=config.reward.limit(),
    )


def apply_update(
    pool: EnginePool,
    members: list[Member],
    shaped: np.ndarray,
    learning_rate: float,
    noise_std: float,
    slots: SlotPopulation | None = None,
) -> float:
    start = time.perf_counter()
    coefficients = update_coefficients(shaped, [m.sign for m in members], learning_rate, noise_std)
    terms = update_terms(members, coefficients)
    if slots is None:
        pool.update([seed for seed, _ in terms], [c for _, c in terms])
    else:
        slots.update(pool, [seed for seed, _ in terms], [c for _, c in terms])
    return time.perf_counter() - start
