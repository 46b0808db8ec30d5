"""KL to the base model (engine/alignment/kl.py and `eslab kl`) on tiny real GPT-2 models,
against a copy of the reference's computation on the same samples."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from engine.alignment.kl import KLSettings, answer_length, kl_to_base, per_token_kl
from engine.config import RunConfig
from engine.data.datasets import Example, write_dataset
from engine.model_files import ModelError

ROOT = Path(__file__).resolve().parents[2]
WORDS = ["how", "do", "i", "make", "a", "cake", "sorry", "the", "water", "is", "good"]
EOS = 1
PROMPTS = ["how do i make a cake", "the water is"]


def tiny_lm(folder: Path, seed: int, base: Path | None = None, noise: float = 0.3) -> Path:
    """A 2-layer random GPT-2 with a word-level tokenizer whose EOS is id 1; with `base`, that
    model's weights plus Gaussian noise (a "fine-tuned" model)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(["<unk>", "</s>", *WORDS])}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="<unk>", eos_token="</s>"
    )
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    tokenizer.save_pretrained(folder)
    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=len(vocab),
        n_positions=64,
        n_embd=16,
        n_layer=2,
        n_head=2,
        bos_token_id=EOS,
        eos_token_id=EOS,
        initializer_range=0.5,
    )
    model = GPT2LMHeadModel(config)
    if base is not None:
        model.load_state_dict(GPT2LMHeadModel.from_pretrained(base).state_dict())
        with torch.no_grad():
            for p in model.parameters():
                p.add_(noise * torch.randn_like(p))
    model.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("lms")
    base = tiny_lm(root / "base", seed=0)
    return base, tiny_lm(root / "tuned", seed=1, base=base)


def reference_kl(model_dir, base_dir, prompts, samples, max_new_tokens, seed):
    """An oracle written here from the fork's description (conciseness/conciseness_eval.py,
    its KL part), not from its code: one RNG seed for the whole evaluation; each sample is one
    Hugging Face `generate` call with sampling on a left-padded prompt of its own; both models
    score the whole sequence in fp32; the generated tokens up to and including the first EOS
    count, each with e^d - d - 1, d = log p_base - log p_tuned."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(seed)
    tuned = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    base = AutoModelForCausalLM.from_pretrained(base_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir, padding_side="left")
    tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token

    def token_logps(model, ids):
        with torch.inference_mode():
            logps = torch.log_softmax(model(input_ids=ids).logits.float(), dim=-1)
        return logps[0, :-1].gather(-1, ids[0, 1:, None])[:, 0]

    per_token, per_sample = [], []
    for prompt in prompts:
        for _ in range(samples):
            encoded = tokenizer([prompt], return_tensors="pt")
            with torch.inference_mode():
                ids = tuned.generate(
                    **encoded,
                    max_new_tokens=max_new_tokens,
                    do_sample=True,
                    pad_token_id=tokenizer.pad_token_id,
                )
            first = encoded["input_ids"].shape[1] - 1  # the first generated token's position
            generated = ids[0, 1:][first:]
            eos = (generated == tokenizer.eos_token_id).nonzero()
            length = int(eos[0, 0]) + 1 if len(eos) else len(generated)
            d = (token_logps(base, ids) - token_logps(tuned, ids))[first : first + length]
            if length:
                kls = (d.exp() - d - 1).tolist()
                per_token += kls
                per_sample.append(float(np.mean(kls)))
    return float(np.mean(per_token)), len(per_token), per_sample


def test_the_kl_is_the_references_on_the_same_samples(models):
    tuned, base = models[1], models[0]
    settings = KLSettings(samples=4, max_new_tokens=12, seed=7)
    result = kl_to_base(tuned, base, PROMPTS, settings, dtype="float32", log=lambda _: None)
    mean, tokens, per_sample = reference_kl(tuned, base, PROMPTS, 4, 12, seed=7)
    assert result.total_tokens == tokens > len(PROMPTS) * 4
    assert result.mean_per_token == pytest.approx(mean, rel=1e-5)
    np.testing.assert_allclose(result.per_sample_mean, per_sample, rtol=1e-5)
    assert result.mean_per_token > 0.01  # the noise moved the model


def test_a_model_is_at_zero_kl_from_itself(models):
    base = models[0]
    result = kl_to_base(
        base,
        base,
        PROMPTS,
        KLSettings(samples=2, max_new_tokens=6, seed=0),
        dtype="float32",
        log=lambda _: None,
    )
    assert result.total_tokens > 0 and result.mean_per_token == 0.0


def test_answers_end_at_their_first_stop_token_which_counts():
    assert answer_length([5, 6, EOS, 7, EOS], {EOS}) == 3
    assert answer_length([EOS], {EOS}) == 1  # an EOS-only answer has one token of KL
    assert answer_length([5, 6], {EOS}) == 2  # cut by max_new_tokens
    np.testing.assert_allclose(per_token_kl([0.0, -1.0], [0.0, -2.0]), [0.0, np.e - 2.0])


def test_bad_settings_and_models_are_refused_naming_them(models, tmp_path):
    with pytest.raises(ModelError, match=r"samples >= 1.*got 0"):
        kl_to_base(models[0], models[0], PROMPTS, KLSettings(samples=0))
    with pytest.raises(ModelError, match=f"cannot load {tmp_path / 'none'} as a causal"):
        kl_to_base(models[0], tmp_path / "none", PROMPTS, KLSettings(samples=1))


def eslab(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "app.cli", *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_eslab_kl_writes_the_result_into_the_checkpoint(models, tmp_path):
    base = models[0]
    checkpoint = tmp_path / "checkpoint-3"
    tiny_lm(checkpoint, seed=1, base=base)
    data = write_dataset(
        [Example(prompt=[{"role": "user", "content": p}], reward_func_args={}) for p in PROMPTS],
        tmp_path / "eval.parquet",
    )
    config = RunConfig.from_flat(
        {
            "train_file": str(data),
            "reward_func_path": "engine.rewards.conciseness.compute_score",
            "model": str(base),
            "dtype": "float32",
            "output_dir": str(tmp_path),
        }
    )
    (checkpoint / "trainer_state.json").write_text(
        json.dumps({"global_step": 3, "config": config.to_flat()})
    )
    done = eslab("kl", str(checkpoint), "--samples", "2", "--max-new-tokens", "5", "--seed", "1")
    assert done.returncode == 0, done.stderr
    written = json.loads((checkpoint / "kl.json").read_text())
    assert written["base"] == str(base) and written["prompts"] == len(PROMPTS)
    assert written["settings"]["samples"] == 2 and written["total_tokens"] > 0
    assert f"{written['mean_per_token']:.6f} per token" in done.stdout
    missing = eslab("kl", str(checkpoint), "--base", str(tmp_path / "no-model"), "--samples", "1")
    assert missing.returncode == 2
    assert f"cannot load {tmp_path / 'no-model'} as a causal language model" in missing.stderr
