"""RewardSources: ensembles of reward functions, member parts, and the scorer's costs (a stub
HTTP server stands in for the service; the real one is tested in tests/integration)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from engine.backends.base import Completion
from engine.config import RunConfig
from engine.scoring.sources import RewardSources, member_name
from tests.integration.scorers import stub_scorer

CONCISE = "engine.rewards.conciseness.compute_score"
PROMPTS = [
    [{"role": "system", "content": "be nice"}, {"role": "user", "content": "q1"}],
    [{"role": "user", "content": "q2"}],
]
OUTPUTS = [[Completion("ab", 2, True)], [Completion("abcd", 4, False)]]
ARGS = [{"target": "abc"}, {"target": "a"}]


def config(**options) -> RunConfig:
    return RunConfig.from_flat({"train_file": "t.parquet", "output_dir": "data/runs/o", **options})


def length(completion_text: str, target: str) -> dict:
    """An ensemble member names every argument the dataset gives (here one it ignores)."""
    return {"reward": float(len(completion_text))}


def test_a_plain_run_has_no_sources():
    assert RewardSources.from_config(config(reward_func_path=CONCISE)) is None


def test_ensemble_of_functions_combines_and_reports_each_member():
    sources = RewardSources.from_config(
        config(
            reward_source="ensemble",
            ensemble_members=f"{CONCISE}, {__name__}.length",
            ensemble_method="min",
        )
    )
    assert sources.member_names() == ["conciseness", "length"]
    batch = sources.score(OUTPUTS, PROMPTS, ARGS, "test")
    # conciseness: -|2-3| = -1, -|4-1| = -3; length: 2, 4; min: -1, -3
    assert batch.parts["member/conciseness"].tolist() == [[-1.0], [-3.0]]
    assert batch.parts["member/length"].tolist() == [[2.0], [4.0]]
    assert batch.rewards.tolist() == [[-1.0], [-3.0]]
    assert batch.clipped.tolist() == [[False], [True]] and "cost" not in batch.parts


def test_scorer_gets_the_last_user_message_and_gives_reward_and_cost():
    seen = []

    def answer(body: dict) -> tuple[int, bytes]:
        seen.append(body)
        n = len(body["prompts"])
        return 200, json.dumps({"rewards": [1.5] * n, "costs": [-0.5] * n}).encode()

    with stub_scorer(answer) as url:
        sources = RewardSources.from_config(config(reward_source="scorer", scorer_url=url))
        batch = sources.score(OUTPUTS, PROMPTS, ARGS, "test")
    assert seen == [{"prompts": ["q1", "q2"], "responses": ["ab", "abcd"]}]
    assert batch.rewards.tolist() == [[1.5], [1.5]]
    assert np.array_equal(batch.parts["cost"], [[-0.5], [-0.5]])


def test_member_names():
    assert member_name("scorer") == "scorer"
    assert member_name("http://127.0.0.1:8001/") == "127.0.0.1_8001"
    assert member_name("pkg.mod.my_reward") == "my_reward"


def test_config_rules_for_sources():
    from engine.config import ConfigError

    with pytest.raises(ConfigError, match="scorer_url is required when reward_source"):
        config(reward_source="scorer")
    with pytest.raises(ConfigError, match="at least 2 members"):
        config(reward_source="ensemble", ensemble_members=CONCISE)
    with pytest.raises(ConfigError, match=r"reward\.reward_func_path is required"):
        config()
    with pytest.raises(ConfigError, match="would ignore lambda"):
        config(reward_source="scorer", scorer_url="http://x", macro_advantage=True)
    with pytest.raises(ConfigError, match="lambda_min must be <= lambda_max"):
        config(reward_func_path=CONCISE, lambda_min=2.0, lambda_max=1.0)
    with pytest.raises(ConfigError, match="only applies to method 'es'"):
        config(method="lbes", n=2, temperature=1.0, reward_func_path=CONCISE, scorer_url="http://x")


def reference_bon_uwo(scores: list[float], coeff: float) -> float:
    """A copy of tlc4418/llm_optimization `src/bon/ensemble_rm.py`
    `uncertainty_weighted_optimization` (np.var: ddof 0)."""
    return np.mean(scores) - coeff * np.var(scores)


def reference_ppo_uwo(scores: np.ndarray, coeff: float) -> np.ndarray:
    """tlc4418/llm_optimization `ppo_reward_functions.py`'s UWO: torch.var, unbiased (ddof 1)."""
    return scores.mean(axis=0) - coeff * scores.var(axis=0, ddof=1)


def test_best_of_n_proxy_uses_the_bon_variance_and_training_the_ppo_one():
    from engine.best_of_n.evaluation import source_for

    run = config(
        reward_source="ensemble",
        ensemble_members=f"{CONCISE}, {__name__}.length",
        ensemble_method="uwo",
        uwo_weight=0.5,
    )
    # members per sample: conciseness -1, -3; length 2, 4
    members = np.array([[-1.0, -3.0], [2.0, 4.0]])
    bon = source_for("run", run).score(OUTPUTS, PROMPTS, ARGS, "test").rewards.reshape(-1)
    assert bon.tolist() == pytest.approx([reference_bon_uwo(members[:, i], 0.5) for i in (0, 1)])
    assert bon.tolist() == pytest.approx([0.5 - 0.5 * 2.25, 0.5 - 0.5 * 12.25])
    training = RewardSources.from_config(run).score(OUTPUTS, PROMPTS, ARGS, "test").rewards
    assert training.reshape(-1).tolist() == pytest.approx(reference_ppo_uwo(members, 0.5).tolist())
    assert training.reshape(-1).tolist() == pytest.approx([0.5 - 0.5 * 4.5, 0.5 - 0.5 * 24.5])
