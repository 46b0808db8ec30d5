"""The interface between the trainer and a perturbation engine.

The trainer drives an engine only through these methods, so unit tests can hand it a fake
and the vLLM backend (engine.backends.vllm) or a pool of them can sit behind it unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from engine.prompts import Prompt


class EngineError(RuntimeError):
    """An engine failed or refused an operation; the message says which and why."""


class EvaluationStopped(EngineError):
    """A population evaluation was stopped between members because a stop was asked for."""


class EngineLostError(EngineError):
    """An engine's process is gone (its node left the Ray cluster, or the process was
    killed): the engines can no longer apply the same updates, so the run cannot go on. The
    message names the engine and where it ran; `eslab resume` continues from the last
    checkpoint on the engines the cluster has then."""


class EngineMismatchError(EngineError):
    """Engines that must hold identical weights do not (their checksums differ)."""

    def __init__(self, checksums: Sequence[str]) -> None:
        self.checksums = list(checksums)
        lines = ", ".join(f"engine {i}: {c[:16]}" for i, c in enumerate(self.checksums))
        super().__init__(
            f"engines disagree on their weights after an update ({lines}); every engine "
            "must apply the same (seed, coefficient) pairs in the same order"
        )


@dataclass(frozen=True)
class Completion:
    """One generated completion of one prompt.

    `token_ids` are the generated tokens (including the stop token when the model stopped by
    itself); passing them back to `completion_logprobs` scores exactly what was generated,
    where re-tokenizing `text` may split it differently.
    """

    text: str
    num_tokens: int
    finished: bool
    """True when the model stopped by itself; False when max_tokens clipped it."""
    token_ids: tuple[int, ...] = ()
    prompt_tokens: int = 0
    """Tokens of the prompt it continues (chat template included): the reference's
    `train/num_tokens` counts them once per sample."""


@runtime_checkable
class PerturbationEngine(Protocol):
    """An inference engine whose weights can be perturbed, restored and updated by seed."""

    def generate(
        self,
        prompts: Sequence[Prompt],
        n: int = 1,
        temperature: float = 0.0,
        max_tokens: int = 256,
        seed: int | None = None,
    ) -> list[list[Completion]]:
        """n completions per prompt: chat messages through the chat template (generation
        prompt added), raw text as it is."""
        ...

    def completion_logprobs(
        self, prompts: Sequence[Prompt], completions: Sequence[str | Sequence[int]]
    ) -> list[float]:
        """Mean log-probability of each completion's tokens after its prompt."""
        ...

    def perturb(self, seed: int, scale: float) -> None:
        """weights := unperturbed + scale * eps(seed); replaces any earlier perturbation."""
        ...

    def restore(self) -> None:
        """Back to the unperturbed weights, bit for bit."""
        ...

    def update(self, seeds: Sequence[int], coefficients: Sequence[float]) -> None:
        """theta += sum_i coefficients[i] * eps(seeds[i]), accumulated in fp32."""
        ...

    def checksum(self) -> str:
        """A digest of the weights (serving and master); equal engines give equal digests."""
        ...

    def save_hf(self, path: str) -> None:
        """Write the unperturbed weights as a Hugging Face model folder."""
        ...

    def save_master(self, path: str) -> None:
        """Write the fp32 master weights into folder `path` (exact resume)."""
        ...

    def load_master(self, path: str) -> None:
        """Load fp32 master weights written by save_master."""
        ...

    def shutdown(self) -> None:
        """Release the engine (processes, memory)."""
        ...
