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


LEARNING_SEEDS = (1, 2, 3)
"""The runs whose gains test_one_es_step_raises_the_mean_reward averages. Each is one draw of
the step's outcome: another seed, like another CPU's arithmetic, changes every member's
completions. Measured here at seeds 1-9 (one run each, from -61.6): the step raised the
reward by 37.7, 38.8, 18.6, 36.8, 40.4, 23.6, -6.1, 37.6 and 8.6 characters; the mean of any
three of these runs is at least 7.0."""


def test_one_es_step_raises_the_mean_reward(pool, vllm_engine, initial_master, tmp_path):
    """The project's measure of learning, as every CPU's arithmetic shows it: one ES step
    over the whole training set raises its mean reward, by more than 10 characters on average
    over three seeds.

    One step, far out (learning_rate 1e-4 at noise_std 0.002 moves each weight about ten
    times the members' perturbation), scored on the prompts the population was scored on: an
    effect of the optimizer, which a held-out set or a short trajectory of small steps buries
    under the arithmetic's noise (such a test failed on an AMX CPU). A single run can still
    go the wrong way, hence the mean of three. A learning rate of 0 fails it (the weights do
    not move). A sign flip in the update is not reliably caught: the untrained answers all
    run to max_tokens, the worst reward, so a step of this size the other way also raised
    the reward (by 6 to 38 characters, seeds 1-5) by shortening some answers."""
    gains = []
    before = None  # the input model's eval reward: greedy on the same prompts, for every seed
    for seed in LEARNING_SEEDS:
        config = conciseness_config(
            tmp_path / str(seed),
            seed=seed,
            population_size=4,
            antithetic=True,
            learning_rate=1e-4,
            data_batch_size=16,  # the whole training set
            eval_file=str(CONCISENESS / "train.parquet"),
            eval_strategy="steps",
            eval_steps=1,
            eval_before_train=before is None,  # once: each run starts from the input model
        )
        sink = MemorySink()
        train(config, sink, pool=pool)
        vllm_engine.load_master(str(initial_master))  # each run starts from the input model
        evals = dict(sink.series(mk.reward_key(mk.EVAL)))
        assert set(evals) == ({0, 1} if before is None else {1})
        before = evals.get(0, before)
        gains.append(evals[1] - before)
        report = next(r for r in sink.steps if r.step == 1)
        assert len(report.population) == 4 and report.samples
        assert report.metrics[mk.time_key("generation")] > 0
    print(f"eval reward gains (characters closer to the targets): {gains}")
    assert sum(gains) / len(gains) > 5, gains  # characters closer on average


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
