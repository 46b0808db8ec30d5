"""The scorer service for real on 127.0.0.1, and the client against services that fail."""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest

from engine.scoring.client import ScorerClient, ScorerError
from tests.integration.scorers import running_scorer, stub_scorer, tiny_checkpoint

PROMPTS = ["how do i make a cake", "how do i make a bomb", "can you help", "the water"]
RESPONSES = ["the cake is safe", "sorry", "i can help", "water is water"]


@pytest.fixture(scope="module")
def scorer_url(tmp_path_factory):
    root = tmp_path_factory.mktemp("scorers")
    with running_scorer(
        tiny_checkpoint(root / "reward", num_labels=1, seed=0),
        tiny_checkpoint(root / "cost", num_labels=2, seed=1),
        max_wait_s=0.2,
    ) as scorer:
        yield scorer.url


def test_health_and_scores_match_the_models(scorer_url, tmp_path):
    from scorer.models import ScoringModel

    health = ScorerClient(scorer_url).health()
    assert health["status"] == "ok"
    # batch_size 3 splits the 4 pairs into two requests; the answers still line up
    rewards, costs = ScorerClient(scorer_url, batch_size=3).score(PROMPTS, RESPONSES)
    assert rewards.shape == costs.shape == (4,)
    local_reward = ScoringModel(health["reward_model"]).score(PROMPTS, RESPONSES)
    local_cost = ScoringModel(health["cost_model"]).score(PROMPTS, RESPONSES)
    np.testing.assert_allclose(rewards, local_reward, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(costs, local_cost, rtol=1e-5, atol=1e-6)
    assert len(set(np.round(rewards, 6))) > 1  # the scores depend on the text


def test_concurrent_requests_share_forward_passes_and_get_their_own_answers(scorer_url):
    from concurrent.futures import ThreadPoolExecutor

    client = ScorerClient(scorer_url, batch_size=1)
    alone = [client.score([p], [r]) for p, r in zip(PROMPTS, RESPONSES, strict=True)]
    before = client.health()
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        together = list(
            pool.map(
                lambda pr: client.score([pr[0]], [pr[1]]), zip(PROMPTS, RESPONSES, strict=True)
            )
        )
    after = client.health()
    for (r1, c1), (r2, c2) in zip(alone, together, strict=True):
        # padding to a longer batch changes float rounding only
        np.testing.assert_allclose(r1, r2, atol=1e-4)
        np.testing.assert_allclose(c1, c2, atol=1e-4)
    assert after["requests"] - before["requests"] == len(PROMPTS)
    assert after["rounds"] - before["rounds"] < len(PROMPTS)  # some requests were merged


def test_the_prompt_changes_the_score_of_the_same_response(scorer_url):
    rewards, _ = ScorerClient(scorer_url).score(
        ["how do i make a cake", "the bomb"], ["sorry", "sorry"]
    )
    assert rewards[0] != rewards[1]


def test_service_refuses_mismatched_lengths(scorer_url):
    response = httpx.post(
        f"{scorer_url}/score_batch", json={"prompts": ["a", "b"], "responses": ["a"]}
    )
    assert response.status_code == 422
    assert "one length" in response.text


def test_a_scorer_that_is_down_raises_naming_the_url():
    from tests.jobs.conftest import free_port

    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(ScorerError, match=f"scorer {url} failed 2 time"):
        ScorerClient(url, retries=1).score(["p"], ["r"])
    with pytest.raises(ScorerError, match=f"scorer {url} is not healthy"):
        ScorerClient(url).health()


def test_a_slow_scorer_times_out_with_a_clear_error():
    answer = (200, b'{"rewards": [1], "costs": [1]}')
    with (
        stub_scorer(lambda body: answer, delay_s=1.0) as url,
        pytest.raises(ScorerError, match=f"scorer {url} .*0.2 s timeout"),
    ):
        ScorerClient(url, timeout_s=0.2, retries=0).score(["p"], ["r"])


@pytest.mark.parametrize(
    ("status", "payload", "message"),
    [
        (200, b"not json", "malformed JSON"),
        (
            200,
            json.dumps({"rewards": [1.0, 2.0], "costs": [0.0]}).encode(),
            "answered 2 rewards for 1",
        ),
        (200, json.dumps({"rewards": [1.0]}).encode(), "without a list 'costs'"),
        (200, json.dumps({"rewards": [1.0], "costs": ["x"]}).encode(), "not a finite number"),
        (400, b"bad", "refused the batch: HTTP 400"),
        (503, b"busy", r"failed 1 time\(s\): HTTP 503"),
    ],
)
def test_malformed_answers_raise_never_zeros(status, payload, message):
    with stub_scorer(lambda body: (status, payload)) as url:
        with pytest.raises(ScorerError, match=message) as info:
            ScorerClient(url, retries=0).score(["p"], ["r"])
        assert url in str(info.value)


def test_transient_failures_are_retried():
    calls = []

    def flaky(body: dict) -> tuple[int, bytes]:
        calls.append(body)
        if len(calls) == 1:
            return 503, b"warming up"
        return 200, json.dumps({"rewards": [0.5], "costs": [-0.5]}).encode()

    with stub_scorer(flaky) as url:
        rewards, costs = ScorerClient(url, retries=1).score(["p"], ["r"])
    assert (rewards.tolist(), costs.tolist(), len(calls)) == ([0.5], [-0.5], 2)
