"""The scorer HTTP service, served by uvicorn, with the reference's endpoints:
`GET /health`; `POST /score_batch` and `POST /score` `{prompts, responses}` -> `{rewards,
costs}`; `POST /score_texts {texts}` -> `{rewards, costs}`, each text a whole conversation
"BEGINNING OF CONVERSATION: USER: ... ASSISTANT:..." (scorer/conversation.py). The
reference's `/score` scores pair by pair and `/score_batch` in batches; here both are the
same batched scoring, which gives the same numbers up to padding's float rounding.

Requests are validated (lists of strings, two of one length, at most MAX_ITEMS) before any
model runs; requests that arrive together are merged (scorer/batcher.py) and scored
in micro-batches of `batch_size` pairs.

The service binds 127.0.0.1 unless told otherwise, and refuses any address other machines
can reach unless a token (ESLAB_SCORER_TOKEN) is set: then every request, /health included,
must carry `Authorization: Bearer TOKEN` (compared in constant time) or gets 401. The token
travels in clear over plain HTTP, so beyond a trusted network put TLS in front.
"""

from __future__ import annotations

import hmac
from typing import Any

from engine.extras import require
from engine.hosts import is_loopback
from engine.scoring.client import TOKEN_ENV
from scorer.batcher import RequestBatcher
from scorer.conversation import ConversationFormatError, split_text
from scorer.models import DEFAULT_MAX_LENGTH, ScoringModel

SERVICE = "the scorer service"
BaseModel = require("pydantic", "scorer", SERVICE).BaseModel
MAX_ITEMS = 4096
MIN_TOKEN = 16


class ScorerServiceError(Exception):
    """The service was asked to start in a way that would expose it; the message says how
    to start it safely."""


def check_bind(host: str, token: str | None) -> None:
    """Refuse a token too short to resist guessing, and a non-loopback `host` without one."""
    if token is not None and len(token) < MIN_TOKEN:
        raise ScorerServiceError(
            f"{TOKEN_ENV} must have at least {MIN_TOKEN} characters, got {len(token)}; "
            'make one with `python -c "import secrets; print(secrets.token_urlsafe(32))"`'
        )
    if token is None and not is_loopback(host):
        raise ScorerServiceError(
            f"--host {host} is reachable from other machines and {TOKEN_ENV} is not set, so "
            f"anyone could use the models; set {TOKEN_ENV} to a secret (at least {MIN_TOKEN} "
            "characters) here and in the environment of the runs that call the scorer, or "
            "serve 127.0.0.1 only (the default)"
        )


def _authorized(header: str, token: str) -> bool:
    scheme, _, value = header.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(
        value.strip().encode(), token.encode()
    )


# Module level, not inside create_app: FastAPI resolves the (postponed) annotations of the
# endpoints in the module's namespace.
class ScoreRequest(BaseModel):
    prompts: list[str]
    responses: list[str]


class ScoreTextsRequest(BaseModel):
    texts: list[str]


class ScoreResponse(BaseModel):
    rewards: list[float]
    costs: list[float]


def create_app(
    reward: ScoringModel, cost: ScoringModel, max_wait_s: float = 0.01, token: str | None = None
) -> Any:
    """The FastAPI application around a loaded reward and cost model; requests arriving
    within `max_wait_s` of each other share forward passes (RequestBatcher). With `token`,
    every request without it as a bearer token gets 401 before any endpoint runs."""
    fastapi = require("fastapi", "scorer", SERVICE)
    FastAPI, HTTPException = fastapi.FastAPI, fastapi.HTTPException

    app = FastAPI(title="ES Lab scorer")
    batcher = RequestBatcher(reward, cost, max_wait_s=max_wait_s, max_items=MAX_ITEMS)

    if token is not None:
        JSONResponse = require("fastapi.responses", "scorer", SERVICE).JSONResponse

        @app.middleware("http")
        async def require_token(request: Any, call_next: Any) -> Any:
            if not _authorized(request.headers.get("authorization", ""), token):
                return JSONResponse(
                    {"detail": f"missing or wrong bearer token (the scorer's {TOKEN_ENV})"},
                    status_code=401,
                    headers={"WWW-Authenticate": "Bearer"},
                )
            return await call_next(request)

    def checked_size(count: int) -> None:
        if count > MAX_ITEMS:
            raise HTTPException(
                413, f"at most {MAX_ITEMS} items per request, got {count}: split the batch"
            )

    @app.get("/health")
    def health() -> dict[str, Any]:
        return {
            "status": "ok",
            "reward_model": reward.path,
            "cost_model": cost.path,
            "input_format": reward.input_format,
            "max_length": reward.max_length,
            "requests": batcher.requests,
            "rounds": batcher.rounds,
        }

    # Plain `def`s run in FastAPI's thread pool, so a long batch does not block /health.
    @app.post("/score_batch", response_model=ScoreResponse)
    @app.post("/score", response_model=ScoreResponse)
    def score_batch(request: ScoreRequest) -> ScoreResponse:
        if len(request.prompts) != len(request.responses):
            raise HTTPException(
                422,
                f"prompts and responses must have one length, got "
                f"{len(request.prompts)} and {len(request.responses)}",
            )
        checked_size(len(request.prompts))
        rewards, costs = batcher.score(request.prompts, request.responses)
        return ScoreResponse(rewards=rewards, costs=costs)

    @app.post("/score_texts", response_model=ScoreResponse)
    def score_texts(request: ScoreTextsRequest) -> ScoreResponse:
        checked_size(len(request.texts))
        try:
            pairs = [split_text(text, i) for i, text in enumerate(request.texts)]
        except ConversationFormatError as exc:
            raise HTTPException(422, str(exc)) from exc
        rewards, costs = batcher.score([p for p, _ in pairs], [r for _, r in pairs])
        return ScoreResponse(rewards=rewards, costs=costs)

    return app


def serve(
    reward_model: str,
    cost_model: str,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    batch_size: int = 32,
    max_length: int = DEFAULT_MAX_LENGTH,
    input_format: str = "pair",
    token: str | None = None,
) -> None:
    """Load both models and serve until interrupted (`eslab scorer serve`); a bind that
    `check_bind` refuses stops before any model loads."""
    check_bind(host, token)
    uvicorn = require("uvicorn", "scorer", SERVICE)

    options = {"batch_size": batch_size, "max_length": max_length, "input_format": input_format}
    reward = ScoringModel(reward_model, **options)
    cost = ScoringModel(cost_model, **options)
    print(
        f"scorer: reward model {reward_model}, cost model {cost_model} ({input_format} input, "
        f"{max_length} tokens); http://{host}:{port}/score_batch, /score, /score_texts"
        + (" (bearer token required)" if token else ""),
        flush=True,
    )
    app = create_app(reward, cost, token=token)
    uvicorn.run(app, host=host, port=port, log_level="warning")
