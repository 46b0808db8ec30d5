"""KL to the base model: how far fine-tuning moved a model's answers, the "KL" column of the
ES paper's conciseness table (Qiu et al. 2025, Table 2).

As the reference evaluation (jbejjani2022/es-fine-tuning-paper, `conciseness/
conciseness_eval.py`): the fine-tuned model samples `samples` answers per prompt (at most 128
new tokens), and on each answer's tokens, up to and including the first end-of-sequence
token, both models' log-probabilities give the per-token estimate

    KL_t = exp(d_t) - d_t - 1,   d_t = log p_base(y_t | ...) - log p_ft(y_t | ...)

(Schulman's k3: non-negative, unbiased for KL(ft || base) under the fine-tuned model's
samples). The result is the mean over every answer token of every sample, as the reference's
`mean_per_token`. Both models run in Hugging Face transformers, on the GPU when there is one,
one answer at a time as the reference does.

Sampling: the reference's `--temperature 0.7` and `--top_p` never reach `generate` (they are
commented out there), so it samples with the model's own generation config (Qwen2.5-Instruct's
says temperature 0.7, top-p 0.8, top-k 20). `temperature` None does the same; a number
samples at that temperature with neither top-p nor top-k.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine.model_files import ModelError

Prompt = str | Sequence[dict[str, str]]  # raw text, or chat messages (the chat template's)


@dataclass(frozen=True)
class KLSettings:
    """The reference's defaults."""

    samples: int = 20
    max_new_tokens: int = 128
    temperature: float | None = None  # None: the model's generation config
    seed: int | None = None


@dataclass(frozen=True)
class RewardColumn:
    """The conciseness table's reward column: the conciseness reward of every sampled answer
    (decoded without special tokens and stripped, as the reference does), and its mean and
    std mapped onto [0, 1] as the reference reports them: (mean + 2000) / 2001, std / 2001."""

    mean: float
    std: float
    normalized_mean: float
    normalized_std: float
    answers: int

    @classmethod
    def of(cls, rewards: Sequence[float]) -> RewardColumn:
        mean, std = float(np.mean(rewards)), float(np.std(rewards))
        return cls(
            mean, std, (mean + REWARD_SPAN - 1) / REWARD_SPAN, std / REWARD_SPAN, len(rewards)
        )


REWARD_SPAN = 2001
"""The reference's normalization of the conciseness reward: (R + 2000) / 2001."""


@dataclass(frozen=True)
class KLResult:
    model: str
    base: str
    prompts: int
    settings: KLSettings
    mean_per_token: float  # NaN when no answer had a token
    total_tokens: int
    per_sample_mean: list[float]  # each answer's mean KL (answers with tokens)
    reward: RewardColumn | None = None  # with the prompts' conciseness targets

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Answers:
    """What sampling `samples` answers per prompt gave: each answer's per-token KL (answers
    with tokens) and, with targets, its conciseness reward."""

    kls: list[np.ndarray]
    rewards: list[float]

    @property
    def mean_per_token(self) -> float:
        every = np.concatenate(self.kls) if self.kls else np.zeros(0)
        return float(every.mean()) if every.size else float("nan")


def per_token_kl(base_logps: np.ndarray, model_logps: np.ndarray) -> np.ndarray:
    """k3 = exp(d) - d - 1 with d = log p_base - log p_model, token by token."""
    d = np.asarray(base_logps, dtype=np.float64) - np.asarray(model_logps, dtype=np.float64)
    return np.exp(d) - d - 1.0


def answer_length(answer_ids: Sequence[int], stop_ids: set[int]) -> int:
    """Tokens of an answer up to and including its first stop token (all when none)."""
    for i, token in enumerate(answer_ids):
        if token in stop_ids:
            return i + 1
    return len(answer_ids)


def token_logps(model: Any, ids: Any, start: int, length: int) -> np.ndarray:
    """log p(ids[t] | ids[:t]) for t in [start, start + length): one forward pass."""
    import torch

    with torch.inference_mode():
        logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
        logps = torch.log_softmax(logits[0, start - 1 : start + length - 1].float(), dim=-1)
        picked = logps.gather(-1, ids[0, start : start + length].unsqueeze(-1)).squeeze(-1)
    return picked.cpu().numpy()


def load_causal_lm(path: str | Path, dtype: str = "auto") -> Any:
    """A causal LM from `path`, in eval mode, on the GPU when there is one."""
    import torch
    from transformers import AutoModelForCausalLM

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        model = AutoModelForCausalLM.from_pretrained(
            str(path), dtype=dtype if dtype == "auto" else getattr(torch, dtype)
        )
    except (OSError, ValueError) as exc:
        raise ModelError(f"cannot load {path} as a causal language model: {exc}") from exc
    return model.to(device).eval()


def check_settings(settings: KLSettings) -> None:
    if (
        settings.samples < 1
        or settings.max_new_tokens < 1
        or (settings.temperature is not None and settings.temperature <= 0)
    ):
        raise ModelError(
            "the KL evaluation needs samples >= 1, max_new_tokens >= 1 and temperature > 0, "
            f"got {settings.samples}, {settings.max_new_tokens} and {settings.temperature}"
        )


def kl_to_base(
    model_dir: str | Path,
    base_dir: str | Path,
    prompts: Sequence[Prompt],
    settings: KLSettings = KLSettings(),
    *,
    targets: Sequence[str] | None = None,
    dtype: str = "auto",
    log: Callable[[str], None] = print,
) -> KLResult:
    """The mean per-token KL of `model_dir`'s sampled answers to `base_dir`'s model; with
    each prompt's conciseness target, the same answers' reward column too."""
    from transformers import AutoTokenizer

    check_settings(settings)
    model, base = load_causal_lm(model_dir, dtype), load_causal_lm(base_dir, dtype)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    answers = sample_answers(model, base, tokenizer, prompts, settings, targets, log, model_dir)
    return KLResult(
        model=str(model_dir),
        base=str(base_dir),
        prompts=len(prompts),
        settings=settings,
        mean_per_token=answers.mean_per_token,
        total_tokens=int(sum(k.size for k in answers.kls)),
        per_sample_mean=[float(k.mean()) for k in answers.kls],
        reward=RewardColumn.of(answers.rewards) if targets is not None else None,
    )


def sample_answers(
    model: Any,
    base: Any,
    tokenizer: Any,
    prompts: Sequence[Prompt],
    settings: KLSettings,
    targets: Sequence[str] | None = None,
    log: Callable[[str], None] = print,
    model_dir: str | Path = "the model",
) -> Answers:
    """`settings.samples` answers of `model` per prompt, one at a time as the reference
    samples them, each answer's KL to `base` and, with targets, its conciseness reward."""
    import torch

    from engine.rewards.conciseness import compute_score

    if targets is not None and len(targets) != len(prompts):
        raise ModelError(f"{len(targets)} targets for {len(prompts)} prompts")
    if settings.seed is not None:
        torch.manual_seed(settings.seed)
    device = next(model.parameters()).device
    stop_ids = _stop_ids(tokenizer, model)
    answers = Answers([], [])
    for p, prompt in enumerate(prompts):
        log(f"answers: prompt {p + 1}/{len(prompts)}, {settings.samples} samples")
        ids = _prompt_ids(tokenizer, prompt, model_dir).to(device)
        for _ in range(settings.samples):
            kl, text = _sample(model, base, tokenizer, ids, stop_ids, settings)
            if kl.size:
                answers.kls.append(kl)
            if targets is not None:
                answers.rewards.append(compute_score(text, target=targets[p])["reward"])
    return answers


def _sample(
    model: Any, base: Any, tokenizer: Any, ids: Any, stop_ids: set[int], settings: KLSettings
) -> tuple[np.ndarray, str]:
    """One sampled answer: its per-token KL to `base` and its text, decoded without special
    tokens and stripped (the reference's)."""
    import torch

    sampling = (
        {}
        if settings.temperature is None
        else {"temperature": settings.temperature, "top_p": 1.0, "top_k": 0}
    )
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    with torch.inference_mode():
        full = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=True,
            max_new_tokens=settings.max_new_tokens,
            pad_token_id=pad,
            **sampling,
        )
    start = ids.shape[1]
    text = tokenizer.decode(full[0, start:], skip_special_tokens=True).strip()
    length = answer_length(full[0, start:].tolist(), stop_ids)
    if length == 0:
        return np.zeros(0), text
    full = full[:, : start + length]
    kl = per_token_kl(
        token_logps(base, full, start, length), token_logps(model, full, start, length)
    )
    return kl, text


def _stop_ids(tokenizer: Any, model: Any) -> set[int]:
    """The tokens that end an answer: the tokenizer's and the generation config's EOS."""
    ids = model.generation_config.eos_token_id
    found = set(ids if isinstance(ids, list) else [ids] if ids is not None else [])
    if tokenizer.eos_token_id is not None:
        found.add(tokenizer.eos_token_id)
    return found


def _prompt_ids(tokenizer: Any, prompt: Prompt, model_dir: str | Path) -> Any:
    """[1, T] token ids: a raw-text prompt tokenized as it is (as the reference); chat
    messages through the model's chat template, which writes its own special tokens."""
    if isinstance(prompt, str):
        return tokenizer(prompt, return_tensors="pt")["input_ids"]
    if not tokenizer.chat_template:
        raise ModelError(
            f"the tokenizer of {model_dir} has no chat template for the dataset's chat "
            "messages; use a dataset of raw-text prompts"
        )
    text = tokenizer.apply_chat_template(list(prompt), add_generation_prompt=True, tokenize=False)
    return tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
