"""What one request may make the scorer service hold: a body over the cap and a text over the
cap get a 413 that says so, and a request whose scores do not come gets a 503 instead of a
thread held forever. The service runs in-process (Starlette's test client) around stand-in
models: these are limits of the service, not of the models."""

from __future__ import annotations

import json
import threading

import pytest
from starlette.testclient import TestClient

from scorer.service import MAX_BODY_BYTES, MAX_TEXT_CHARS, create_app


class StandIn:
    """A model that scores every text 1.0, after `gate` opens."""

    path, input_format, max_length = "stand-in", "pair", 512

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.gate.set()
        self.scored = 0

    def score(self, prompts: list[str], responses: list[str]) -> list[float]:
        self.gate.wait()
        self.scored += len(prompts)
        return [1.0] * len(prompts)


@pytest.fixture
def model() -> StandIn:
    return StandIn()


@pytest.fixture
def client(model) -> TestClient:
    return TestClient(create_app(model, model, max_wait_s=0.0, wait_timeout_s=0.3))


def test_a_body_over_the_cap_is_refused_before_anything_is_scored(client, model):
    pad = "x" * (MAX_BODY_BYTES // 8)
    body = json.dumps({"prompts": [pad] * 5, "responses": [pad] * 5})
    response = client.post("/score_batch", content=body)
    assert response.status_code == 413
    assert f"over {MAX_BODY_BYTES} bytes" in response.json()["detail"]
    assert model.scored == 0


def test_a_body_without_a_length_is_cut_off_at_the_cap(client, model):
    """Chunked: no Content-Length to refuse it by, so the bytes received are counted."""
    chunk = b"x" * (1024 * 1024)
    chunks = iter([b'{"prompts": ["'] + [chunk] * (MAX_BODY_BYTES // len(chunk) + 1))
    response = client.post("/score_batch", content=chunks)
    assert response.status_code == 413 and model.scored == 0


@pytest.mark.parametrize(
    ("path", "body", "named"),
    [
        ("/score_batch", {"prompts": ["p", "q"], "responses": ["r", "long"]}, "responses[1]"),
        ("/score", {"prompts": ["long"], "responses": ["r"]}, "prompts[0]"),
        ("/score_texts", {"texts": ["long"]}, "texts[0]"),
    ],
)
def test_a_text_over_the_cap_is_named_in_a_413(client, model, path, body, named):
    long = "y" * (MAX_TEXT_CHARS + 1)
    body = {key: [long if t == "long" else t for t in texts] for key, texts in body.items()}
    response = client.post(path, json=body)
    assert response.status_code == 413
    assert response.json()["detail"].startswith(
        f"{named} has {MAX_TEXT_CHARS + 1} characters, at most {MAX_TEXT_CHARS}"
    )
    assert model.scored == 0


def test_requests_under_the_caps_are_scored(client):
    text = "z" * MAX_TEXT_CHARS
    response = client.post("/score_batch", json={"prompts": [text], "responses": [text]})
    assert response.status_code == 200 and response.json()["rewards"] == [1.0]


def test_a_request_whose_scores_never_come_gets_a_503(client, model):
    model.gate.clear()  # the models are stuck on a batch
    try:
        response = client.post("/score_batch", json={"prompts": ["p"], "responses": ["r"]})
    finally:
        model.gate.set()
    assert response.status_code == 503
    assert "no scores within 0.3 s" in response.json()["detail"]
    assert response.headers["retry-after"] == "10"
