"""Where a run's reward R (and cost C) come from: a reward function, the scorer service, or an
ensemble of reward functions and scorer reward models (engine/scoring/ensembles.py).

`RewardSources` is picklable (tasks carry it to Ray actors) and turns one batch of generated
completions into a ScoredBatch: `rewards` is R, `parts["cost"]` is C when a scorer is set,
and `parts["member/<name>"]` each ensemble member's own score, so the dashboard can show where
members disagree. The scorer sees the prompt (engine.prompts.user_text) as context and the
completion as the text it scores, as two segments of one pair.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from engine.prompts import Prompt, user_text
from engine.scoring.batch import ScoredBatch, score_batch
from engine.scoring.client import ScorerClient
from engine.scoring.ensembles import TRAINING_DDOF, combine
from engine.scoring.members import (
    SCORER_MEMBER,
    is_function,
    is_url,
    member_name,
    parse_members,
)
from engine.scoring.reward_process import RewardLimit

if TYPE_CHECKING:
    from engine.backends.base import Completion
    from engine.config import RunConfig

COST = "cost"


def member_part(name: str) -> str:
    """The ScoredBatch part holding ensemble member `name`'s own scores."""
    return f"member/{name}"


def function_paths(config: RunConfig) -> list[str]:
    """The reward functions a run scores with: its reward_func_path, or the function members
    of its ensemble (none when the scorer's reward model gives R)."""
    source = config.alignment.reward_source
    if source == "function" and config.reward.reward_func_path is not None:
        return [config.reward.reward_func_path]
    if source == "ensemble":
        return [m for m in parse_members(config.ensemble.ensemble_members) if is_function(m)]
    return []


@dataclass(frozen=True)
class RewardSources:
    reward_source: str  # function | scorer | ensemble
    reward_func_path: str | None
    scorer_url: str | None  # gives C (and R with reward_source scorer)
    members: tuple[str, ...] = ()
    ensemble_method: str = "mean"
    uwo_weight: float = 0.1
    scorer_batch_size: int = 16
    scorer_timeout_s: float = 60.0
    scorer_retries: int = 2
    reward_limit: RewardLimit | None = None  # for the reward functions (None: no limit)
    ensemble_ddof: int = TRAINING_DDOF
    """uwo's variance: training keeps the reference's PPO form; best-of-n passes BON_DDOF."""

    @classmethod
    def from_config(cls, config: RunConfig) -> RewardSources | None:
        """None for a plain run (a reward function and no scorer)."""
        a, e = config.alignment, config.ensemble
        if a.reward_source == "function" and a.scorer_url is None:
            return None
        members = tuple(parse_members(e.ensemble_members))
        return cls(
            reward_source=a.reward_source,
            reward_func_path=config.reward.reward_func_path,
            scorer_url=a.scorer_url,
            members=members,
            ensemble_method=e.ensemble_method,
            uwo_weight=e.uwo_weight,
            scorer_batch_size=a.scorer_batch_size,
            scorer_timeout_s=a.scorer_timeout_s,
            scorer_retries=a.scorer_retries,
            reward_limit=config.reward.limit(),
        )

    def client(self, url: str) -> ScorerClient:
        """A client for `url` with the run's batch size, timeout and retries."""
        return ScorerClient(url, self.scorer_batch_size, self.scorer_timeout_s, self.scorer_retries)

    def member_names(self) -> list[str]:
        names = [member_name(m) for m in self.members]
        return [n if names.count(n) == 1 else f"{n}{i}" for i, n in enumerate(names)]

    def score(
        self,
        outputs: list[list[Completion]],
        prompts: list[Prompt],
        reward_func_args: list[dict[str, Any]],
        description: str,
    ) -> ScoredBatch:
        shape = (len(outputs), len(outputs[0]) if outputs else 0)
        pairs = [
            (user_text(prompt), c.text)
            for prompt, cs in zip(prompts, outputs, strict=True)
            for c in cs
        ]
        context, texts = [p for p, _ in pairs], [t for _, t in pairs]
        scorer_rewards = costs = None
        if self.scorer_url is not None:
            scorer_rewards, costs = self.client(self.scorer_url).score(context, texts)

        def by_function(path: str) -> ScoredBatch:
            return score_batch(outputs, reward_func_args, path, description, self.reward_limit)

        parts: dict[str, np.ndarray] = {}
        if self.reward_source == "function":
            assert self.reward_func_path is not None  # the config's rule
            batch = by_function(self.reward_func_path)
            rewards, parts = batch.rewards, batch.parts
        elif self.reward_source == "scorer":
            rewards = scorer_rewards.reshape(shape)
        else:
            scores = []
            for member, name in zip(self.members, self.member_names(), strict=True):
                if member == SCORER_MEMBER:
                    values = scorer_rewards.reshape(shape)
                elif is_url(member):
                    values = self.client(member).score(context, texts)[0].reshape(shape)
                else:
                    values = by_function(member).rewards
                parts[member_part(name)] = values
                scores.append(values)
            rewards = combine(
                np.stack(scores), self.ensemble_method, self.uwo_weight, ddof=self.ensemble_ddof
            )
        if costs is not None:
            parts[COST] = costs.reshape(shape)
        return ScoredBatch.of(outputs, rewards, parts)
