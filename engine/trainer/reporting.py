"""What a step tells the Sink: metrics under the keys of engine/metrics.py, population rows
and samples, built from the step's scored batches (docs/metrics.md lists the keys)."""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass

import numpy as np

from engine import metrics as mk
from engine.backends.pool import EnginePool
from engine.config import RunConfig
from engine.data.datasets import Example
from engine.es import Member
from engine.prompts import render_prompt
from engine.scoring.batch import ScoredBatch
from engine.sink import PopulationRecord, SampleRecord, StepReport


@dataclass(frozen=True)
class Totals:
    """What the reference logs summed over the run (nlp-waseda/lbes `train/num_tokens`,
    `train/time/total`); kept in the trainer state, so a resumed run goes on counting."""

    num_tokens: int = 0
    seconds: float = 0.0


def step_report(
    report: StepReport,
    *,
    noise_std: float,
    learning_rate: float,
    epoch: float,
    evaluation: StepReport | None,
    started: float,
    totals: Totals,
) -> tuple[StepReport, Totals]:
    """The report the sink gets for a finished step: the step's own metrics, the schedules'
    values, the run's totals and rates, and the evaluation when one was due; and the totals
    after this step.

    `time/step` is the wall time since `started` without the evaluation due at the step, as
    the reference's (its evaluation runs after the step is timed), so the rates are those of
    training alone."""
    seconds = time.perf_counter() - started
    if evaluation is not None:
        seconds -= evaluation.metrics.get(mk.EVAL_RUNTIME, 0.0)
    totals = Totals(totals.num_tokens + report.num_tokens, totals.seconds + seconds)
    metrics = {
        **report.metrics,
        mk.NOISE_STD: noise_std,
        mk.LEARNING_RATE: learning_rate,
        mk.EPOCH: epoch,
        mk.NUM_TOKENS: float(totals.num_tokens),
        mk.TOKENS_PER_SECOND: report.num_tokens / seconds,
        mk.SAMPLES_PER_SECOND: report.num_samples / seconds,
        mk.time_key("step"): seconds,
        mk.TIME_TOTAL: totals.seconds,
        **(evaluation.metrics if evaluation is not None else {}),
    }
    samples = report.samples + (evaluation.samples if evaluation is not None else [])
    return (
        StepReport(
            step=report.step,
            metrics=finite(metrics),
            population=report.population,
            samples=samples,
            num_tokens=report.num_tokens,
            num_samples=report.num_samples,
        ),
        totals,
    )


def completion_tokens(report: StepReport) -> float:
    """The completion tokens a logged step generated (what the benchmarks' throughput counts;
    `train/num_tokens` is the run's total, prompts included)."""
    return report.metrics[mk.completion_key(mk.TRAIN, "mean_length")] * report.num_samples


def finite(metrics: dict[str, float]) -> dict[str, float]:
    """Only the finite values: a statistic of nothing (no terminated completion, an LBES step
    whose correlations are all NaN) is left out, where the reference logs NaN."""
    return {k: v for k, v in metrics.items() if np.isfinite(v)}


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


def stacked_parts(results: list[ScoredBatch]) -> dict[str, np.ndarray]:
    """Each reward part over the population, [N, B, n]; NaN where a member's batch lacks it."""
    names = sorted({name for r in results for name in r.parts})
    return {
        name: np.stack([r.parts.get(name, np.full(r.rewards.shape, np.nan)) for r in results])
        for name in names
    }


def sample_spread(values: np.ndarray, axis: int) -> float:
    """nlp-waseda/lbes's `<k>/std`: the std along `axis` (ES: across the population, LBES:
    across a prompt's n samples), averaged over the rest. NaN entries (a part a sample lacks)
    are left out."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN slices give NaN, left out
        return float(np.nanmean(np.nanstd(values, axis=axis)))


def train_score_metrics(
    rewards: np.ndarray, parts: dict[str, np.ndarray], axis: int
) -> dict[str, float]:
    """The step's rewards as the reference logs them: `train/<k>/mean` over every scored
    sample and `train/<k>/std` (sample_spread along `axis`) for the reward and each part,
    the reward's min and max, and the share of spreads that are zero within np.isclose's
    tolerance (`frac_reward_zero_std`). rewards: [N, B, n] for ES (axis 0), [B, n] for LBES
    (axis 1); parts of the same shape."""
    rewards = np.asarray(rewards, dtype=np.float64)
    metrics = {
        mk.reward_key(mk.TRAIN, "reward", "mean"): float(rewards.mean()),
        mk.reward_key(mk.TRAIN, "reward", "std"): sample_spread(rewards, axis),
        mk.reward_key(mk.TRAIN, "reward", "min"): float(rewards.min()),
        mk.reward_key(mk.TRAIN, "reward", "max"): float(rewards.max()),
        mk.FRAC_REWARD_ZERO_STD: float(np.isclose(rewards.std(axis=axis), 0.0).mean()),
    }
    for name, values in parts.items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            metrics[mk.reward_key(mk.TRAIN, name, "mean")] = float(np.nanmean(values))
        metrics[mk.reward_key(mk.TRAIN, name, "std")] = sample_spread(values, axis)
    return metrics


def population_reward_stats(mean_rewards: np.ndarray) -> dict[str, float]:
    """ES: std, min and max over the members' mean rewards (VsonicV/es-at-scale's
    `train/reward/{std,min,max}`); their mean is `train/reward/mean`."""
    return {
        mk.reward_key(mk.TRAIN, mk.POPULATION_REWARD, stat): float(f(mean_rewards))
        for stat, f in (("std", np.std), ("min", np.min), ("max", np.max))
    }


def completion_metrics(split: str, results: list[ScoredBatch]) -> dict[str, float]:
    """Completion lengths in tokens as nlp-waseda/lbes logs them; the terminated ones are the
    completions the model ended itself (none: left out, where the reference logs NaN)."""
    tokens = np.concatenate([r.num_tokens.reshape(-1) for r in results])
    clipped = np.concatenate([r.clipped.reshape(-1) for r in results])
    terminated = tokens[~clipped]
    metrics = {
        mk.completion_key(split, "mean_length"): float(tokens.mean()),
        mk.completion_key(split, "min_length"): float(tokens.min()),
        mk.completion_key(split, "max_length"): float(tokens.max()),
        mk.completion_key(split, "clipped_ratio"): float(clipped.mean()),
    }
    if terminated.size:
        metrics |= {
            mk.completion_key(split, "mean_terminated_length"): float(terminated.mean()),
            mk.completion_key(split, "min_terminated_length"): float(terminated.min()),
            mk.completion_key(split, "max_terminated_length"): float(terminated.max()),
        }
    return metrics


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
