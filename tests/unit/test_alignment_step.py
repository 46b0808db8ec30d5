"""What an alignment step generates, around the toy engine of test_trainer and a stdlib
scorer stand-in: the unperturbed model is generated only when lambda adapts (as the
reference). The real engine and scorer run the adapting case in
tests/integration/test_alignment_run.py."""

from __future__ import annotations

import json

import pytest

from engine import metrics as mk
from engine.data.datasets import Example, write_dataset
from engine.sink import MemorySink
from engine.trainer import train
from tests.integration.scorers import stub_scorer
from tests.unit.test_trainer import ToyPool, make_config

POPULATION, STEPS = 4, 2


@pytest.fixture
def dataset(tmp_path):
    examples = [
        Example(prompt=[{"role": "user", "content": f"question {i}"}], reward_func_args={})
        for i in range(8)
    ]
    return str(write_dataset(examples, tmp_path / "train.parquet"))


class RecordingPool(ToyPool):
    """ToyPool counting generations: all of its engine's, and the unperturbed model's (the
    pool's own `generate`, which also runs on the engine)."""

    def __init__(self) -> None:
        super().__init__()
        self.engine_generations = 0
        self.unperturbed_generations = 0
        engine_generate = self.engine.generate

        def counted(*args, **kwargs):
            self.engine_generations += 1
            return engine_generate(*args, **kwargs)

        self.engine.generate = counted

    def generate(self, prompts, **sampling):
        self.unperturbed_generations += 1
        return super().generate(prompts, **sampling)


def answer(body: dict) -> tuple[int, bytes]:
    """Reward 1 and cost 0.5 for every pair."""
    n = len(body["prompts"])
    return 200, json.dumps({"rewards": [1.0] * n, "costs": [0.5] * n}).encode()


def scorer_config(dataset, tmp_path, url, **options):
    """A run of POPULATION members scored by the scorer at `url`, which is not retried."""
    return make_config(
        dataset,
        tmp_path,
        reward_source="scorer",
        reward_func_path=None,
        scorer_url=url,
        scorer_retries=0,
        population_size=POPULATION,
        **options,
    )


@pytest.mark.parametrize("adapt", [False, True])
def test_the_unperturbed_model_is_generated_only_to_adapt_lambda(dataset, tmp_path, adapt):
    pool, sink = RecordingPool(), MemorySink()
    with stub_scorer(answer) as url:
        config = scorer_config(
            dataset,
            tmp_path,
            url,
            max_steps=STEPS,
            eval_strategy="no",
            lambda_adapt=adapt,
        )
        train(config, sink, pool=pool)
    assert pool.unperturbed_generations == (STEPS if adapt else 0)
    assert pool.engine_generations == POPULATION * STEPS + pool.unperturbed_generations
    for report in sink.steps:
        assert report.metrics[mk.LAMBDA] > 0
        assert (mk.JC_RAW in report.metrics) == adapt
        assert any(s.member is None for s in report.samples) == adapt


@pytest.mark.parametrize("positive_only", [False, True])
def test_j_c_is_logged_raw_clipped_and_smoothed_with_its_d(dataset, tmp_path, positive_only):
    """Every cost is 0.5 and d is 1: J_C raw is -0.5 every step; the J_C the rule averages is
    its positive part (0) with lambda_pos_cost_only, as the fork's `lambda/J_C`."""
    sink = MemorySink()
    with stub_scorer(answer) as url:
        config = scorer_config(
            dataset,
            tmp_path,
            url,
            max_steps=STEPS,
            eval_strategy="no",
            lambda_adapt=True,
            cost_threshold_d=1.0,
            lambda_pos_cost_only=positive_only,
        )
        train(config, sink, pool=ToyPool())
    expected = 0.0 if positive_only else -0.5
    for report in sink.steps:
        m = report.metrics
        assert m[mk.JC_RAW] == pytest.approx(-0.5) and m[mk.COST_THRESHOLD] == 1.0
        assert m[mk.JC] == pytest.approx(expected) and m[mk.JC_SMOOTHED] == pytest.approx(expected)


def varied(body: dict) -> tuple[int, bytes]:
    """Rewards 1, 2, 3, ... and costs alternating +0.5 / -0.25 over a request's pairs."""
    n = len(body["prompts"])
    costs = [0.5 if i % 2 == 0 else -0.25 for i in range(n)]
    return 200, json.dumps({"rewards": [float(i + 1) for i in range(n)], "costs": costs}).encode()


# The eval set's scores under `varied` (8 prompts, one request), in sample order.
EVAL_REWARDS = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]
EVAL_COSTS = [0.5, -0.25] * 4
# (lambda, mean_combined) of the three evals (before training, after steps 1 and 2), by
# standardize_within_batch: the lambdas are this run's (0.5, then two lambda_lr 0.5 updates);
# each mean_combined is what jbejjani2022/es-fine-tuning-paper's `run_final_evaluation`
# (alignment/es-fine-tuning_alignment_accl_api.py, commit 84c16db0) returned, run once from
# its snapshot outside this repository on EVAL_REWARDS, EVAL_COSTS, that lambda and
# safe_first with factor 0.3 (its arithmetic is fp32, ES Lab's fp64: hence rel=1e-5).
REFERENCE_EVALS = {
    False: [
        (0.5, 3.0374999046325684),
        (0.5322472294589298, 3.0334689617156982),
        (0.5665742265334133, 3.0291781425476074),
    ],
    True: [
        (0.5, 1.0649864673614502),
        (0.5322472294589298, 1.0542373657226562),
        (0.5665742265334133, 1.0427950620651245),
    ],
}


@pytest.mark.parametrize("standardize", [False, True])
def test_eval_mean_combined_is_the_references_with_the_latest_lambda(
    dataset, tmp_path, standardize
):
    sink = MemorySink()
    with stub_scorer(varied) as url:
        config = scorer_config(
            dataset,
            tmp_path,
            url,
            max_steps=2,
            eval_steps=1,
            eval_before_train=True,
            lambda_adapt=True,
            lambda_lr=0.5,
            safe_first=True,
            safe_first_factor=0.3,
            standardize_within_batch=standardize,
        )
        train(config, sink, pool=ToyPool())
    evals = [r for r in sink.steps if mk.EVAL_MEAN_COMBINED in r.metrics]
    lambdas = [0.5] + [r.metrics[mk.LAMBDA_NEXT] for r in sink.steps if mk.LAMBDA_NEXT in r.metrics]
    assert len(evals) == 3  # before training, after steps 1, 2
    assert lambdas == pytest.approx([lam for lam, _ in REFERENCE_EVALS[standardize]], rel=1e-9)
    for report, (_, expected) in zip(evals, REFERENCE_EVALS[standardize], strict=True):
        eval_samples = [s for s in report.samples if s.split == mk.EVAL]
        assert [s.reward for s in eval_samples] == EVAL_REWARDS
        assert [s.reward_parts["cost"] for s in eval_samples] == EVAL_COSTS
        assert report.metrics[mk.EVAL_MEAN_COMBINED] == pytest.approx(expected, rel=1e-5)


def test_each_members_samples_carry_their_reward_and_cost(dataset, tmp_path):
    """Every (prompt, sample)'s reward and cost of each member is recorded, in the order of
    the member's logged completions, and the member's means are theirs."""
    import numpy as np

    sink = MemorySink()
    with stub_scorer(varied) as url:
        config = scorer_config(
            dataset,
            tmp_path,
            url,
            max_steps=1,
            n=2,
            eval_strategy="no",
        )
        train(config, sink, pool=ToyPool())
    (report,) = sink.steps
    per_member = config.data.data_batch_size * config.sampling.n
    for p in report.population:
        assert len(p.sample_rewards) == len(p.sample_costs) == per_member
        assert np.mean(p.sample_rewards) == pytest.approx(p.reward)
        assert np.mean(p.sample_costs) == pytest.approx(p.cost)
        assert set(p.sample_costs) == {0.5, -0.25}  # the scorer's, not their mean
        logged = [s for s in report.samples if s.member == p.member]
        for s in logged:
            at = s.prompt_index * config.sampling.n + s.sample_index
            assert (p.sample_rewards[at], p.sample_costs[at]) == (s.reward, s.reward_parts["cost"])
    assert {s.member for s in report.samples} <= {p.member for p in report.population}
    assert any(s.member is not None for s in report.samples)


def test_a_scorer_that_restarts_is_waited_for_and_one_that_stays_away_fails_the_step():
    """A scorer answering 503 while it restarts (2 s here) is tried again with growing
    pauses until it answers; past its retries the error names it and the attempts."""
    import time

    from engine.scoring.client import ScorerClient, ScorerError

    back_at = time.monotonic() + 2.0

    def restarting(body: dict) -> tuple[int, bytes]:
        if time.monotonic() < back_at:
            return 503, b"loading the models"
        return answer(body)

    with stub_scorer(restarting) as url:
        rewards, costs = ScorerClient(url, retries=4).score(["p", "q"], ["r", "s"])
        assert rewards.tolist() == [1.0, 1.0] and costs.tolist() == [0.5, 0.5]
    with (
        stub_scorer(lambda body: (503, b"down")) as url,
        pytest.raises(ScorerError, match=rf"scorer {url} failed 3 time\(s\): HTTP 503"),
    ):
        ScorerClient(url, retries=2).score(["p"], ["r"])
