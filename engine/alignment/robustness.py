"""The robustness sweep of the ES paper's conciseness study (the jbejjani2022 fork's
`perturb/sweep.py`): how far a fine-tuned model's conciseness reward falls, and how far its
answers move (their KL to the unperturbed model), when Gaussian noise of standard deviation
sigma is added to `lm_head.weight` alone or to every parameter, `trials` times each (the
reference's 8). Each model is evaluated as the reference evaluates it (engine.alignment.kl:
`samples` answers a prompt, the reward column normalized as (mean + 2000) / 2001).

One difference, on purpose: the reference takes its noise back by subtracting it, which in
bf16 does not give the weights back (rounding), so each of its trials starts from a model
the earlier ones moved a little; here every trial starts from the saved unperturbed weights,
bit for bit. The answers of every evaluation are sampled from the same seed, so the trials
differ by their noise alone. On a model whose `lm_head` shares its weight with the input
embeddings (tied, as small models often are), `lm_head.weight` perturbs both.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from engine.alignment.kl import (
    KLSettings,
    Prompt,
    RewardColumn,
    check_settings,
    load_causal_lm,
    sample_answers,
)
from engine.model_files import ModelError

KINDS = ("lm_head.weight", "all")
SAME_SAMPLES = KLSettings(seed=0)
"""The reference's evaluation settings, every evaluation sampling from one seed."""


@dataclass(frozen=True)
class Trial:
    """One perturbed evaluation, with the reference's columns."""

    sigma: float
    kind: str
    trial: int
    baseline_normalized_reward: float
    perturbed_normalized_reward: float
    normalized_reward_degradation: float
    mean_per_token_kl: float


@dataclass(frozen=True)
class Sweep:
    model: str
    prompts: int
    settings: KLSettings
    seed: int
    baseline: RewardColumn
    trials: list[Trial]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def robustness_sweep(
    model_dir: str | Path,
    prompts: Sequence[Prompt],
    targets: Sequence[str],
    sigmas: Sequence[float],
    *,
    kinds: Sequence[str] = KINDS,
    trials: int = 8,
    settings: KLSettings = SAME_SAMPLES,
    seed: int = 0,
    dtype: str = "auto",
    log: Callable[[str], None] = print,
) -> Sweep:
    import torch
    from transformers import AutoTokenizer

    check_settings(settings)
    unknown = [k for k in kinds if k not in KINDS]
    if unknown or trials < 1 or any(s < 0 for s in sigmas) or not sigmas:
        raise ModelError(
            f"the sweep needs kinds among {', '.join(KINDS)}, trials >= 1 and sigmas >= 0, "
            f"got {list(kinds)}, {trials} and {list(sigmas)}"
        )
    model, unperturbed = load_causal_lm(model_dir, dtype), load_causal_lm(model_dir, dtype)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))

    def evaluate() -> tuple[RewardColumn, float]:
        answers = sample_answers(
            model, unperturbed, tokenizer, prompts, settings, targets, lambda _: None, model_dir
        )
        return RewardColumn.of(answers.rewards), answers.mean_per_token

    saved = {name: p.detach().to("cpu", copy=True) for name, p in model.named_parameters()}
    baseline, _ = evaluate()
    log(f"robustness: unperturbed normalized reward {baseline.normalized_mean:.6f}")
    rows = []
    for s, sigma in enumerate(sigmas):
        for k, kind in enumerate(kinds):
            for t in range(trials):
                generator = torch.Generator(device=next(model.parameters()).device)
                generator.manual_seed(seed * 1_000_003 + (s * len(KINDS) + k) * 10_007 + t)
                _perturb(model, kind, sigma, generator)
                column, kl = evaluate()
                _restore(model, saved)
                rows.append(
                    Trial(
                        sigma=sigma,
                        kind=kind,
                        trial=t + 1,
                        baseline_normalized_reward=baseline.normalized_mean,
                        perturbed_normalized_reward=column.normalized_mean,
                        normalized_reward_degradation=baseline.normalized_mean
                        - column.normalized_mean,
                        mean_per_token_kl=kl,
                    )
                )
                log(
                    f"robustness: sigma {sigma:g}, {kind}, trial {t + 1}/{trials}: normalized "
                    f"reward {column.normalized_mean:.6f}, KL {kl:.6f}"
                )
    return Sweep(str(model_dir), len(prompts), settings, seed, baseline, rows)


def _perturb(model: Any, kind: str, sigma: float, generator: Any) -> None:
    import torch

    if kind == "all":
        params = list(model.parameters())
    else:
        try:
            params = [model.get_parameter(kind)]
        except AttributeError:
            raise ModelError(f"the model has no parameter {kind}") from None
    with torch.no_grad():
        for p in params:
            noise = torch.randn(p.shape, generator=generator, device=p.device, dtype=p.dtype)
            p.add_(noise * sigma)


def _restore(model: Any, saved: dict[str, Any]) -> None:
    import torch

    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(saved[name])
