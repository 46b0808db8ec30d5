"""Sample data for the page tests (AppTest and Chromium). LBES samples for the inspector:
added to a seeded run (tests/app/conftest.py's beta-run) at steps 1 and 2, kept or dropped by
the real LBES filters (engine.lbes.filter_rewards), one completion changing between the steps
and one long. A sweep with runs in every state, made in the store (no engine needed)."""

from __future__ import annotations

import numpy as np

from engine import metrics as mk
from engine.config import LbesConfig, RunConfig
from engine.lbes import filter_rewards, reference_tiebreak
from engine.sink import SampleRecord, StepReport
from jobs.store.records import SweepRecord
from jobs.store.status import RunStatus
from jobs.store.store import Store
from jobs.sweeps import parse_space, trial_config
from jobs.sweeps.driver import start_sweep, sweep_tag, trial_name
from jobs.sweeps.history import pruned_event
from jobs.sweeps.spec import grid_points

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


SWEEP_SPACE = {
    "method": "grid",
    "budget": 6,
    "objective": {"metric": "train/reward/mean", "mode": "max"},
    "parameters": {
        "noise_std": {"values": [0.001, 0.002, 0.003]},
        "population_size": {"values": [4, 8]},
    },
}
SWEEP_TRIALS = (
    # (trial, status, train reward per step, stopped early by the sweep)
    (0, RunStatus.SUCCEEDED, [0.1, 0.3], False),
    (1, RunStatus.SUCCEEDED, [0.2, 0.9], False),  # the best
    (2, RunStatus.CANCELLED, [0.1], True),
    (3, RunStatus.RUNNING, [0.5], False),
    (4, RunStatus.QUEUED, [], False),
    (5, RunStatus.FAILED, [], False),
)
"""Six runs of a grid sweep (trials numbered from 0, as the driver numbers them) in every
state: 4 done of 6 (2 complete, 1 stopped early, 1 failed), 1 running, 1 queued; ranked
trial 1, then trial 0."""


def add_sweep(store: Store, base: RunConfig, name: str = "noise-sweep") -> SweepRecord:
    """A sweep started as `eslab sweep` starts it, with the runs of SWEEP_TRIALS stored as its
    trials (as the scheduler's pass would queue them), their steps and, for the run stopped
    early, the sweep's mark."""
    spec = parse_space(SWEEP_SPACE, base)
    sweep = start_sweep(store, base, spec, name=name)
    points = list(grid_points(spec.parameters))
    for trial, status, rewards, pruned in SWEEP_TRIALS:
        config = trial_config(base, {**points[trial], "run_name": trial_name(name, trial)})
        run = store.create_run(
            name=trial_name(name, trial),
            method=config.method,
            config=config.to_flat(),
            total_steps=2,
            tags=[sweep_tag(name)],
            status=RunStatus.RUNNING if rewards else RunStatus.QUEUED,
            sweep_id=sweep.id,
            sweep_trial=trial,
        )
        for step, reward in enumerate(rewards, start=1):
            store.record_step(
                run.id, StepReport(step=step, metrics={mk.reward_key(mk.TRAIN): reward})
            )
        if pruned:
            store.request_cancel(run.id, reason=pruned_event(run.attempt, "below the median"))
        if status.is_terminal():
            store.finish_run(run.id, status, error="boom" if status is RunStatus.FAILED else None)
    return store.get_sweep(sweep.id)
