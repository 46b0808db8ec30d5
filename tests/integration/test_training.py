"""The training loop on the real engine (vLLM on the CPU, the default model).

Every test starts from the input model: the `pool` fixture (conftest.py) loads the input
model's fp32 master back into the shared session engine after each test.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from engine import metrics as mk
from engine.config import RunConfig
from engine.paths import PROJECT_ROOT
from engine.sink import MemorySink
from engine.trainer import train
from engine.trainer.reporting import completion_tokens

pytestmark = pytest.mark.heavy

CONCISENESS = PROJECT_ROOT / "data" / "conciseness"  # shipped with the repository


def conciseness_config(tmp_path: Path, **options) -> RunConfig:
    base = {
        "method": "es",
        "train_file": str(CONCISENESS / "train.parquet"),
        "output_dir": str(tmp_path / "out"),
        "reward_func_path": "engine.rewards.conciseness.compute_score",
        "population_size": 4,
        "data_batch_size": 2,
        "max_steps": 1,
        "max_tokens": 16,
        "noise_std": 0.002,
        "learning_rate": 4e-5,
        "seed": 7,
    }
    return RunConfig.from_flat({**base, **options})


def untimed(metrics: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in metrics.items() if not mk.depends_on_wall_clock(k)}


def test_es_on_conciseness_raises_the_mean_reward(pool, tmp_path):
    """The project's measure of learning: a short ES run with a fixed seed raises the eval
    reward."""
    config = conciseness_config(
        tmp_path,
        population_size=8,
        data_batch_size=8,
        max_steps=3,
        max_tokens=32,  # as the es-conciseness preset: the targets are short answers
        eval_file=str(CONCISENESS / "test.parquet"),
        eval_strategy="steps",
        eval_steps=3,
    )
    sink = MemorySink()
    train(config, sink, pool=pool)
    evals = dict(sink.series(mk.reward_key(mk.EVAL)))
    print(f"eval reward (minus characters off the target): {evals}")
    assert set(evals) == {0, 3}
    assert evals[3] > evals[0] + 10, evals  # at least 10 characters closer on average
    first = next(r for r in sink.steps if r.step == 1)
    assert len(first.population) == 8 and first.samples
    assert first.metrics[mk.time_key("generation")] > 0


def test_learning_rate_zero_saves_the_input_weights(pool, tmp_path, default_model_dir):
    config = conciseness_config(tmp_path, learning_rate=0.0, population_size=2, max_tokens=8)
    output = train(config, MemorySink(), pool=pool)
    saved = load_file(output / "model.safetensors")
    original = load_file(default_model_dir / "model.safetensors")
    assert saved.keys() == original.keys()
    for name, tensor in original.items():
        assert torch.equal(saved[name].view(torch.uint8), tensor.view(torch.uint8)), name


def test_the_same_seed_repeats_a_run_and_a_resume_continues_it_exactly(pool, vllm_engine, tmp_path):
    """A run stopped after step 1 repeats the uninterrupted run's step 1 (same seed, same
    metrics), and resumed from its checkpoint it gives the uninterrupted run's step 2."""
    vllm_engine.save_master(str(tmp_path / "input"))
    options = {"max_steps": 2, "save_strategy": "steps", "save_steps": 1}
    straight = MemorySink()
    train(conciseness_config(tmp_path / "straight", **options), straight, pool=pool)

    vllm_engine.load_master(str(tmp_path / "input"))
    config = conciseness_config(tmp_path / "stopped", **options)
    stopped = MemorySink()
    train(config.with_overrides(["max_steps=1"]), stopped, pool=pool)
    assert [untimed(r.metrics) for r in stopped.steps] == [untimed(straight.steps[0].metrics)]
    vllm_engine.load_master(str(tmp_path / "input"))  # the resumed run must not rely on RAM
    resumed = MemorySink()
    train(config, resumed, pool=pool, resume_from=tmp_path / "stopped" / "out" / "checkpoint-1")
    assert [untimed(r.metrics) for r in resumed.steps] == [untimed(straight.steps[1].metrics)]


def test_lbes_step_reports_filters_logprobs_and_correlations(pool, tmp_path):
    config = conciseness_config(
        tmp_path, method="lbes", n=4, temperature=1.0, top_k_rewards=1, bottom_k_rewards=1
    )
    sink = MemorySink()
    train(config, sink, pool=pool)
    (report,) = sink.steps
    assert len(report.samples) == 2 * 4  # every base sample
    kept = [s for s in report.samples if s.kept]
    assert len(kept) == 2 * 2  # the best and the worst sample of each prompt
    assert all(s.logprob is not None and s.logprob < 0 for s in kept)
    assert {s.dropped_by for s in report.samples if not s.kept} <= {
        "top_k_rewards+bottom_k_rewards"
    }
    assert report.metrics[mk.RETAINED_REWARD_RATIO] == 0.5
    assert all(p.fitness is None or -1 <= p.fitness <= 1 for p in report.population)
    # train/num_tokens as the reference counts it: each prompt (chat template included) once
    # per sample, plus the completions
    prompts_times_n = report.num_tokens - round(completion_tokens(report))
    assert report.metrics[mk.NUM_TOKENS] == report.num_tokens
    assert prompts_times_n > 0 and prompts_times_n % 4 == 0
    assert report.metrics[mk.SAMPLES_PER_SECOND] == pytest.approx(
        8 / report.metrics[mk.time_key("step")]
    )
    ended = mk.completion_key(mk.TRAIN, "mean_terminated_length")
    assert (
        ended in report.metrics or report.metrics[mk.completion_key(mk.TRAIN, "clipped_ratio")] == 1
    )
