"""The scorer beyond loopback: `eslab scorer serve` refuses a non-loopback bind without a
token (before loading any model), and a scorer started with a token answers 401 to every
request without it, while ScorerClient sends it from ESLAB_SCORER_TOKEN."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from engine.scoring.client import TOKEN_ENV, ScorerClient, ScorerError
from scorer.service import MIN_TOKEN, ScorerServiceError, check_bind
from tests.integration.scorers import running_scorer, tiny_checkpoint

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "t0ken-" + "x" * 20


def scorer_serve(*args: str, token: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop(TOKEN_ENV, None)
    if token is not None:
        env[TOKEN_ENV] = token
    return subprocess.run(
        [sys.executable, "-m", "app.cli", "scorer", "serve", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_public_bind_without_token_is_refused_before_any_model_loads(tmp_path):
    missing = str(tmp_path / "no-model")  # never reached: the bind is checked first
    result = scorer_serve("--host", "0.0.0.0", "--reward-model", missing, "--cost-model", missing)
    assert result.returncode == 2
    assert f"reachable from other machines and {TOKEN_ENV} is not set" in result.stderr
    assert "no-model" not in result.stderr


def test_a_short_token_is_refused(tmp_path):
    missing = str(tmp_path / "no-model")
    result = scorer_serve(
        "--host", "0.0.0.0", "--reward-model", missing, "--cost-model", missing, token="abc"
    )
    assert result.returncode == 2
    assert f"{TOKEN_ENV} must have at least {MIN_TOKEN} characters, got 3" in result.stderr


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3", "no-such-host.invalid"])
def test_check_bind_refuses_every_public_host_without_token(host):
    with pytest.raises(ScorerServiceError, match=f"{TOKEN_ENV} is not set"):
        check_bind(host, None)
    check_bind(host, TOKEN)  # with a token: allowed


@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "localhost"])
def test_loopback_needs_no_token(host):
    check_bind(host, None)


@pytest.fixture(scope="module")
def guarded_url(tmp_path_factory):
    root = tmp_path_factory.mktemp("scorers")
    with running_scorer(
        tiny_checkpoint(root / "reward", num_labels=1, seed=0),
        tiny_checkpoint(root / "cost", num_labels=2, seed=1),
        token=TOKEN,
    ) as scorer:
        yield scorer.url


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer wrong-token-wrong-token"},
        {"Authorization": f"Basic {TOKEN}"},
        {"Authorization": f"Bearer {TOKEN[:-1]}"},
        {"Authorization": "Bearer"},
    ],
)
def test_every_request_without_the_token_gets_401(guarded_url, headers):
    for method, path, body in (
        ("GET", "/health", None),
        ("POST", "/score_batch", {"prompts": ["a"], "responses": ["b"]}),
        ("POST", "/score", {"prompts": ["a"], "responses": ["b"]}),
        ("POST", "/score_texts", {"texts": ["BEGINNING OF CONVERSATION: USER: a ASSISTANT:b"]}),
        ("GET", "/docs", None),
        ("GET", "/openapi.json", None),
    ):
        response = httpx.request(method, guarded_url + path, json=body, headers=headers)
        assert response.status_code == 401, (method, path)
        assert response.headers["www-authenticate"] == "Bearer"
        assert "reward" not in response.text  # nothing of the models


def test_the_client_sends_the_token_from_the_environment(guarded_url, monkeypatch):
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    with pytest.raises(ScorerError, match=f"HTTP 401.*{TOKEN_ENV} is not set"):
        ScorerClient(guarded_url, retries=0).score(["how do i make a cake"], ["sorry"])
    with pytest.raises(ScorerError, match=f"not healthy.*{TOKEN_ENV} is not set"):
        ScorerClient(guarded_url).health()
    monkeypatch.setenv(TOKEN_ENV, "wrong-" + TOKEN)
    with pytest.raises(ScorerError, match=f"{TOKEN_ENV} is not the scorer.s token"):
        ScorerClient(guarded_url, retries=0).score(["how do i make a cake"], ["sorry"])
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    assert ScorerClient(guarded_url).health()["status"] == "ok"
    rewards, costs = ScorerClient(guarded_url).score(["how do i make a cake"], ["sorry"])
    assert rewards.shape == costs.shape == (1,)
