"""The rest of the ES paper's conciseness table and its robustness sweep on tiny real GPT-2
models (tests/unit/test_kl.py's): the reward column of the sampled answers, normalized as the
reference reports it; `eslab robustness`, whose zero noise changes nothing, whose noise moves
the answers, and which leaves the weights as they were; the paper's own pairs as a dataset."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from engine.alignment.kl import KLSettings, RewardColumn, kl_to_base
from engine.alignment.robustness import robustness_sweep
from engine.config import RunConfig
from engine.data.conciseness import convert_conciseness_pairs
from engine.data.datasets import DatasetError, load_dataset
from tests.unit.test_kl import PROMPTS, eslab, models, tiny_lm  # noqa: F401 (a fixture)

TARGETS = ["cake", "good"]
QUIET = {"log": lambda _: None}


def test_the_reward_column_is_normalized_as_the_reference_reports_it(models):  # noqa: F811
    tuned, base = models[1], models[0]
    result = kl_to_base(
        tuned,
        base,
        PROMPTS,
        KLSettings(samples=3, max_new_tokens=6, seed=2),
        targets=TARGETS,
        dtype="float32",
        **QUIET,
    )
    reward = result.reward
    assert reward is not None and reward.answers == 3 * len(PROMPTS)
    assert reward.mean <= 0 and reward.normalized_mean == pytest.approx((reward.mean + 2000) / 2001)
    assert reward.normalized_std == pytest.approx(reward.std / 2001)
    assert RewardColumn.of([-2000.0, 0.0]).normalized_mean == pytest.approx(1000 / 2001)
    assert (
        kl_to_base(tuned, base, PROMPTS, KLSettings(samples=1), dtype="float32", **QUIET).reward
        is None
    )


def test_no_noise_changes_nothing_noise_moves_the_answers_and_weights_come_back(models):  # noqa: F811
    tuned = models[1]
    settings = KLSettings(samples=3, max_new_tokens=6, seed=5)
    sweep = robustness_sweep(
        tuned, PROMPTS, TARGETS, [2.0, 0.0], trials=2, settings=settings, dtype="float32", **QUIET
    )
    assert [(t.sigma, t.kind, t.trial) for t in sweep.trials] == [
        (s, k, n) for s in (2.0, 0.0) for k in ("lm_head.weight", "all") for n in (1, 2)
    ]
    assert all(t.mean_per_token_kl > 0.01 for t in sweep.trials[:4])
    for trial in sweep.trials[4:]:  # sigma 0 after the noisy trials: the weights came back
        assert trial.normalized_reward_degradation == 0.0 and trial.mean_per_token_kl == 0.0
    noisy = [t.perturbed_normalized_reward for t in sweep.trials[2:4]]
    assert noisy[0] != noisy[1]  # two trials, two noises


def test_eslab_robustness_writes_its_json_and_the_paper_pairs_convert(models, tmp_path):  # noqa: F811
    pairs = tmp_path / "eval.jsonl"
    pairs.write_text(
        "\n".join(
            json.dumps({"question": p, "answer": t}) for p, t in zip(PROMPTS, TARGETS, strict=True)
        )
        + "\n"
    )
    data = convert_conciseness_pairs(pairs, tmp_path / "eval.parquet").paths[0]
    examples = load_dataset(data, expected_format="raw")
    assert [(e.prompt, e.reward_func_args) for e in examples] == [
        (p, {"target": t}) for p, t in zip(PROMPTS, TARGETS, strict=True)
    ]
    checkpoint = tmp_path / "checkpoint-2"
    tiny_lm(checkpoint, seed=1, base=models[0])
    before = {
        k: v.clone()
        for k, v in AutoModelForCausalLM.from_pretrained(checkpoint).state_dict().items()
    }
    config = RunConfig.from_flat(
        {
            "train_file": str(data),
            "prompt_format": "raw",
            "reward_func_path": "engine.rewards.conciseness.compute_score",
            "model": str(models[0]),
            "dtype": "float32",
            "output_dir": str(tmp_path),
        }
    )
    (checkpoint / "trainer_state.json").write_text(
        json.dumps({"global_step": 2, "config": config.to_flat()})
    )
    done = eslab(
        "robustness",
        str(checkpoint),
        "--sigma",
        "0.5",
        "--trials",
        "1",
        "--samples",
        "2",
        "--max-new-tokens",
        "4",
    )
    assert done.returncode == 0, done.stderr
    written = json.loads((checkpoint / "robustness.json").read_text())
    assert [t["kind"] for t in written["trials"]] == ["lm_head.weight", "all"]
    assert "largest drop" in done.stdout
    after = AutoModelForCausalLM.from_pretrained(checkpoint).state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # the folder is untouched

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "q"}\n')
    with pytest.raises(
        DatasetError, match=r"bad\.jsonl: line 1: 'answer' must be a non-empty string"
    ):
        convert_conciseness_pairs(bad, tmp_path / "x.parquet")
