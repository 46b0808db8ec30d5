"""LBES samples for the inspector's tests (AppTest and Chromium): added to a seeded run
(tests/app/conftest.py's beta-run) at steps 1 and 2, kept or dropped by the real LBES filters
(engine.lbes.filter_rewards), one completion changing between the steps and one long."""

from __future__ import annotations

import numpy as np

from engine.config import LbesConfig
from engine.lbes import filter_rewards, reference_tiebreak
from engine.sink import SampleRecord, StepReport
from jobs.store.store import Store

FILTERS = LbesConfig(top_k_prompt_reward_var=1, top_k_rewards=1, bottom_k_rewards=1)
PROMPTS = {1: "[user] What is 3 times 4?", 2: "[user] Name a prime number."}
REWARDS = np.array([[0.0, 0.5, 1.0], [0.2, 0.2, 0.2]])
"""Prompt 1 varies (kept, but its middle sample falls to top/bottom-k); prompt 2 does not
(dropped by the prompt-variance filter)."""
END = "END-OF-THE-LONG-COMPLETION"
LONG = " ".join(f"step{i} of the working shows the product again" for i in range(60)) + f" {END}"
CHANGED = {
    1: "The answer is 7 because 3 plus 4 is 7",
    2: "The answer is 12 because 3 times 4 is 12",
}
"""Prompt 1, sample 0 at steps 1 and 2: what the compare view diffs."""


def completion(step: int, prompt: int, sample: int) -> str:
    if (prompt, sample) == (1, 0):
        return CHANGED[step]
    if (step, prompt, sample) == (2, 1, 2):
        return LONG
    return f"step {step} prompt {prompt} sample {sample} dropped-or-kept text"


def add_lbes_samples(store: Store, run_id: int) -> None:
    """Steps 1 and 2 of run `run_id` get 2 prompts x 3 samples of the base model each."""
    result = filter_rewards(REWARDS, FILTERS, reference_tiebreak(0, 0))
    for step in (1, 2):
        samples = [
            SampleRecord(
                split="train",
                prompt_index=prompt,
                sample_index=j,
                prompt=PROMPTS[prompt],
                completion=completion(step, prompt, j),
                reward=float(REWARDS[b, j]),
                reward_parts={"accuracy": float(REWARDS[b, j] > 0.5)},
                logprob=-1.5 + 0.1 * j,
                kept=bool(result.kept[b, j]),
                dropped_by=result.dropped_by[b, j],
            )
            for b, prompt in enumerate(PROMPTS)
            for j in range(REWARDS.shape[1])
        ]
        store.record_step(run_id, StepReport(step=step, metrics={}, samples=samples))
