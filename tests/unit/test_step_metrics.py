"""The metrics an ES and an LBES step write, against a copy of nlp-waseda/lbes's own
computation (`src/es_trainer.py`, `src/lbes_trainer.py`: the `train_log` and `eval_log` dicts)
on the same completions.

A fake pool stands in for vLLM: completion lengths depend on the prompt, the sample and the
member's perturbation, some hit max_tokens, and every prompt has its own token count, so each
statistic has something to get wrong."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engine import metrics as mk
from engine.backends.base import Completion
from engine.config import RunConfig
from engine.data.datasets import Example, write_dataset
from engine.sink import MemorySink
from engine.trainer import train
from engine.trainer.es_step import es_step
from engine.trainer.lbes_step import lbes_step

MAX_TOKENS = 9
PROMPT_TOKENS = (7, 11, 4)
SCALES = (1e-12, 1.0, 0.5)  # prompt 0's rewards differ by 1e-12: np.isclose's zero std


def scaled_length(completion_text: str, scale: float) -> dict[str, float]:
    """A reward with a part, on the completion's length: prompt 0's spreads are ~1e-12."""
    return {"reward": scale * len(completion_text), "format": 0.1 * (len(completion_text) % 2)}


class FakePool:
    """The EnginePool surface a step uses; completions as a function of (member, prompt,
    sample), so the reference's arrays can be rebuilt from the same function."""

    def __init__(self) -> None:
        self.offset = 0
        self.last_stats = {"perturb_s": 0.0, "restore_s": 0.0}

    @staticmethod
    def length(offset: int, prompt: int, sample: int) -> int:
        return 3 + prompt + 2 * sample + offset

    def generate(self, prompts, *, n, temperature, max_tokens, seed):
        out = []
        for b, messages in enumerate(prompts):
            index = int(messages[-1]["content"].split()[-1])
            out.append(
                [
                    Completion(
                        text="x" * min(self.length(self.offset, b, j), max_tokens),
                        num_tokens=min(self.length(self.offset, b, j), max_tokens),
                        finished=self.length(self.offset, b, j) < max_tokens,
                        token_ids=tuple(range(min(self.length(self.offset, b, j), max_tokens))),
                        prompt_tokens=PROMPT_TOKENS[index],
                    )
                    for j in range(n)
                ]
            )
        return out

    def evaluate(self, perturbations, task, stop=None):
        results = []
        for seed, _ in perturbations:
            self.offset = seed % 3
            results.append(task(self))
        self.offset = 0
        return results

    def completion_logprobs(self, prompts, completions):
        return [-float(len(c)) * (1 + 0.1 * self.offset) for c in completions]

    def update(self, seeds, coefficients) -> None:
        """The weights do not matter here: every step generates the same completions."""

    def save_hf(self, path: str) -> None:
        Path(path).mkdir(parents=True, exist_ok=True)

    def save_master(self, path: str) -> None:
        self.save_hf(path)

    def load_master(self, path: str) -> None:
        assert Path(path).is_dir()

    def shutdown(self) -> None:
        pass


EXAMPLES = [
    Example(prompt=[{"role": "user", "content": f"question {i}"}], reward_func_args={"scale": s})
    for i, s in enumerate(SCALES)
]


def config(method: str, **options) -> RunConfig:
    return RunConfig.from_flat(
        {
            "method": method,
            "train_file": "t.parquet",
            "output_dir": "data/runs/o",
            "reward_func_path": f"{__name__}.scaled_length",
            "population_size": 6,
            "data_batch_size": 3,
            "n": 3,
            "temperature": 1.0,
            "max_tokens": MAX_TOKENS,
            **options,
        }
    )


def reference_log(
    scores: dict[str, np.ndarray],
    completion_lengths: np.ndarray,
    is_terminated: np.ndarray,
    std_axis: int,
) -> dict[str, float]:
    """A copy of the reference's train_log arithmetic (ES: arrays [N, B, n], std across the
    population; LBES: [B, n], std across the n samples)."""
    if std_axis == 0:
        std_scores = {
            f"{k}/std": v.reshape(v.shape[0], -1).std(axis=0).mean().item()
            for k, v in scores.items()
        }
        reward_stds = scores["reward"].reshape(scores["reward"].shape[0], -1).std(axis=0)
    else:
        std_scores = {f"{k}/std": v.std(axis=1).mean().item() for k, v in scores.items()}
        reward_stds = scores["reward"].std(axis=1)
    terminated = completion_lengths[is_terminated]
    return {
        "completions/mean_length": completion_lengths.mean().item(),
        "completions/min_length": completion_lengths.min().item(),
        "completions/max_length": completion_lengths.max().item(),
        "completions/clipped_ratio": np.mean(~is_terminated).item(),
        "completions/mean_terminated_length": terminated.mean().item(),
        "completions/min_terminated_length": terminated.min().item(),
        "completions/max_terminated_length": terminated.max().item(),
        **{f"{k}/mean": v.mean().item() for k, v in scores.items()},
        **std_scores,
        "frac_reward_zero_std": np.isclose(reward_stds, 0.0).mean().item(),
    }


def lengths(offsets: list[int], n: int) -> np.ndarray:
    """[N, B, n] generated lengths before clipping."""
    return np.array(
        [[[FakePool.length(o, b, j) for j in range(n)] for b in range(3)] for o in offsets]
    )


def expected_scores(raw: np.ndarray) -> dict[str, np.ndarray]:
    clipped = np.minimum(raw, MAX_TOKENS)
    scale = np.array(SCALES).reshape((1,) * (raw.ndim - 2) + (3, 1))
    return {"reward": scale * clipped, "format": 0.1 * (clipped % 2)}


def assert_matches(metrics: dict[str, float], reference: dict[str, float]) -> None:
    """Every reference key under `train/`, equal to rounding; all differences in one message."""
    wrong = {
        key: (metrics.get(f"train/{key}"), want)
        for key, want in reference.items()
        if metrics.get(f"train/{key}") != pytest.approx(want, rel=1e-12, abs=1e-15)
    }
    assert wrong == {}


def test_an_es_step_writes_the_references_metrics():
    cfg = config("es")
    pool = FakePool()
    report = es_step(cfg, pool, EXAMPLES, 0, noise_std=0.01, learning_rate=0.1)
    from engine.es import population

    members = population(cfg.data.seed, 0, cfg.es.population_size, cfg.es.antithetic)
    raw = lengths([m.seed % 3 for m in members], cfg.sampling.n)  # [N, B, n]
    scores = expected_scores(raw)
    reference = reference_log(scores, np.minimum(raw, MAX_TOKENS), raw < MAX_TOKENS, std_axis=0)
    # prompt 0's ~1e-12 spreads count as zero, as np.isclose counts them; exact equality not
    exact = (scores["reward"].reshape(len(members), -1).std(axis=0) == 0).mean()
    assert reference["frac_reward_zero_std"] > exact
    assert_matches(report.metrics, reference)
    # the reference's train/num_tokens of one step: every member's prompts, once per sample
    prompt_lengths = np.tile(PROMPT_TOKENS, (len(members), 1))  # [N, B]
    assert report.num_tokens == prompt_lengths.sum() * 3 + np.minimum(raw, MAX_TOKENS).sum()
    assert report.num_samples == 3 * len(members) * 3  # B * N * n
    # ES Lab's own spread, VsonicV/es-at-scale's train/reward/std: over the members' means
    member_means = scores["reward"].mean(axis=(1, 2))
    key = mk.reward_key(mk.TRAIN, mk.POPULATION_REWARD, "std")
    assert report.metrics[key] == pytest.approx(member_means.std())


def test_an_lbes_step_writes_the_references_metrics():
    cfg = config("lbes")
    report = lbes_step(cfg, FakePool(), EXAMPLES, 0, noise_std=0.01, learning_rate=0.1)
    raw = lengths([0], cfg.sampling.n)[0]  # [B, n]: the unperturbed model
    reference = reference_log(
        expected_scores(raw), np.minimum(raw, MAX_TOKENS), raw < MAX_TOKENS, std_axis=1
    )
    assert (
        reference["frac_reward_zero_std"] > (expected_scores(raw)["reward"].std(axis=1) == 0).mean()
    )
    assert_matches(report.metrics, reference)
    assert report.num_tokens == sum(PROMPT_TOKENS) * 3 + np.minimum(raw, MAX_TOKENS).sum()
    assert report.num_samples == 3 * 3  # B * n

    # no completion ended by itself: the reference logs NaN, ES Lab leaves the key out
    cfg = config("lbes", max_tokens=1)
    report = lbes_step(cfg, FakePool(), EXAMPLES, 0, noise_std=0.01, learning_rate=0.1)
    assert report.metrics[mk.completion_key(mk.TRAIN, "clipped_ratio")] == 1.0
    assert mk.completion_key(mk.TRAIN, "mean_terminated_length") not in report.metrics


@pytest.fixture
def dataset(tmp_path):
    return str(write_dataset(EXAMPLES, tmp_path / "train.parquet"))


@pytest.mark.parametrize("method", ["es", "lbes"])
def test_a_run_writes_cumulative_tokens_and_time_and_the_rates(method, dataset, tmp_path):
    cfg = config(
        method,
        train_file=dataset,
        eval_file=dataset,
        output_dir=str(tmp_path / "out"),
        max_steps=3,
        eval_strategy="steps",
        eval_steps=2,
        save_strategy="steps",
        save_steps=2,
    )
    sink = MemorySink()
    train(cfg, sink, pool=FakePool())
    steps = [r for r in sink.steps if mk.NUM_TOKENS in r.metrics]
    assert [r.step for r in steps] == [1, 2, 3]
    per_step = [r.num_tokens for r in steps]
    assert all(t > 0 for t in per_step)
    assert [r.metrics[mk.NUM_TOKENS] for r in steps] == list(np.cumsum(per_step))
    seconds = [r.metrics[mk.time_key("step")] for r in steps]
    assert [r.metrics[mk.TIME_TOTAL] for r in steps] == pytest.approx(list(np.cumsum(seconds)))
    for r, s in zip(steps, seconds, strict=True):
        assert r.metrics[mk.SAMPLES_PER_SECOND] == pytest.approx(r.num_samples / s)
        assert r.metrics[mk.TOKENS_PER_SECOND] == pytest.approx(r.num_tokens / s)
    # the eval at step 2: one greedy completion a prompt over the eval time
    evaluated = next(r for r in sink.steps if r.step == 2)
    assert evaluated.metrics[mk.EVAL_SAMPLES_PER_SECOND] == pytest.approx(
        len(EXAMPLES) / evaluated.metrics[mk.EVAL_RUNTIME]
    )
    assert evaluated.metrics[mk.EVAL_TOTAL_SAMPLES] == len(EXAMPLES)

    # a resumed run goes on counting from the checkpoint
    resumed = MemorySink()
    train(cfg, resumed, pool=FakePool(), resume_from=tmp_path / "out" / "checkpoint-2")
    (last,) = [r for r in resumed.steps if mk.NUM_TOKENS in r.metrics]
    assert last.metrics[mk.NUM_TOKENS] == steps[-1].metrics[mk.NUM_TOKENS]
    assert last.metrics[mk.TIME_TOTAL] > steps[1].metrics[mk.TIME_TOTAL]
