"""What a step tells the Sink: metrics under the keys of engine/metrics.py, population rows
and samples, built from the step's scored batches (docs/metrics.md lists the keys)."""

from __future__ import annotations

import time

import numpy as np

from engine import metrics as mk
from engine.backends.pool import EnginePool
from engine.config import RunConfig
from engine.data.datasets import Example
from engine.es import Member
from engine.prompts import render_prompt
from engine.scoring.batch import ScoredBatch
from engine.sink import PopulationRecord, SampleRecord, StepReport


def step_report(
    report: StepReport,
    *,
    noise_std: float,
    learning_rate: float,
    epoch: float,
    evaluation: StepReport | None,
    started: float,
) -> StepReport:
    """The report the sink gets for a finished step: the step's own metrics, the schedules'
    values, the evaluation when one was due, and the step's wall time since `started`."""
    report.metrics.update(
        {mk.NOISE_STD: noise_std, mk.LEARNING_RATE: learning_rate, mk.EPOCH: epoch}
    )
    if evaluation is not None:
        report.metrics.update(evaluation.metrics)
        report.samples.extend(evaluation.samples)
    report.metrics[mk.time_key("step")] = time.perf_counter() - started
    return StepReport(
        step=report.step,
        metrics=report.metrics,
        population=report.population,
        samples=report.samples,
    )


def logging_due(config: RunConfig, step: int, total_steps: int) -> bool:
    return step % config.logging.logging_steps == 0 or step == total_steps


def phase_timings(pool: EnginePool) -> dict[str, float]:
    """Perturb and restore seconds of the last population evaluation."""
    stats = pool.last_stats
    return {
        mk.time_key("perturb"): stats.get("perturb_s", 0.0),
        mk.time_key("restore"): stats.get("restore_s", 0.0),
    }


def reward_stats(split: str, part: str, values: np.ndarray) -> dict[str, float]:
    values = np.asarray(values, dtype=np.float64)
    return {
        mk.reward_key(split, part, "mean"): float(values.mean()),
        mk.reward_key(split, part, "std"): float(values.std()),
        mk.reward_key(split, part, "min"): float(values.min()),
        mk.reward_key(split, part, "max"): float(values.max()),
    }


def part_means(split: str, results: list[ScoredBatch]) -> dict[str, float]:
    names = sorted({name for r in results for name in r.parts})
    return {
        mk.reward_key(split, name, "mean"): float(
            np.nanmean(
                np.concatenate([r.parts[name].reshape(-1) for r in results if name in r.parts])
            )
        )
        for name in names
    }


def completion_metrics(split: str, results: list[ScoredBatch]) -> dict[str, float]:
    tokens = np.concatenate([r.num_tokens.reshape(-1) for r in results])
    clipped = np.concatenate([r.clipped.reshape(-1) for r in results])
    return {
        mk.completion_key(split, "mean_length"): float(tokens.mean()),
        mk.completion_key(split, "min_length"): float(tokens.min()),
        mk.completion_key(split, "max_length"): float(tokens.max()),
        mk.completion_key(split, "clipped_ratio"): float(clipped.mean()),
        f"{split}/num_tokens": float(tokens.sum()),
    }


def population_records(
    members: list[Member], fitness: np.ndarray, shaped: np.ndarray
) -> list[PopulationRecord]:
    def finite(x: float) -> float | None:
        return float(x) if np.isfinite(x) else None

    return [
        PopulationRecord(member=m.index, seed=m.seed, fitness=finite(f), shaped_fitness=finite(a))
        for m, f, a in zip(members, fitness, shaped, strict=True)
    ]


def sample_records(
    split: str,
    examples: list[Example],
    batch: ScoredBatch,
    *,
    member: int | None,
    kept: np.ndarray | None = None,
    dropped_by: np.ndarray | None = None,
    logprob: np.ndarray | None = None,
) -> list[SampleRecord]:
    records = []
    for b, example in enumerate(examples):
        prompt = render_prompt(example.prompt)
        for j, text in enumerate(batch.texts[b]):
            parts = {k: float(v[b, j]) for k, v in batch.parts.items() if np.isfinite(v[b, j])}
            records.append(
                SampleRecord(
                    split=split,
                    prompt_index=b,
                    sample_index=j,
                    prompt=prompt,
                    completion=text,
                    reward=float(batch.rewards[b, j]),
                    reward_parts=parts,
                    member=member,
                    logprob=float(logprob[b, j])
                    if logprob is not None and np.isfinite(logprob[b, j])
                    else None,
                    kept=bool(kept[b, j]) if kept is not None else None,
                    dropped_by=dropped_by[b, j] if dropped_by is not None else None,
                )
            )
    return records
