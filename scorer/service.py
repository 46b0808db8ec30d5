"""The scorer HTTP service, served by uvicorn, with the reference's endpoints:
`GET /health`; `POST /score_batch` and `POST /score` `{prompts, responses}` -> `{rewards,
costs}`; `POST /score_texts {texts}` -> `{rewards, costs}`, each text a whole conversation
"BEGINNING OF CONVERSATION: USER: ... ASSISTANT:..." (scorer/conversation.py). The
reference's `/score` scores pair by pair and `/score_batch` in batches; here both are the
same batched scoring, which gives the same numbers up to padding's float rounding.

Requests are validated (lists of strings, two of one length, at most MAX_ITEMS) before any
model runs; requests that arrive together are merged (scorer/batcher.py) and scored
in micro-batches of `batch_size` pairs.

What one request may make the service hold is capped: a body over MAX_BODY_BYTES is refused
with 413 before it is read whole (at once when its Content-Length says so, else as soon as
the bytes received pass the cap), a text over MAX_TEXT_CHARS with 413 naming it (the models
read only their first `max_length` tokens anyway), and a request whose scores do not come
within WAIT_TIMEOUT_S ends with 503 instead of holding a thread forever.

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
from scorer.batcher import BatcherTimeout, RequestBatcher
from scorer.conversation import ConversationFormatError, split_text
from scorer.models import DEFAULT_MAX_LENGTH, ScoringModel

SERVICE = "the scorer service"
BaseModel = require("pydantic", "scorer", SERVICE).BaseModel
MAX_ITEMS = 4096
MAX_BODY_BYTES = 16 * 1024 * 1024
MAX_TEXT_CHARS = 64_000
WAIT_TIMEOUT_S = 120.0
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


class BodyLimit:
    """ASGI middleware: 413 for a request body over `max_bytes`, decided from Content-Length
    before anything is read, else while reading; the body is then passed on whole."""

    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length", b"0")
        if not declared.isdigit() or int(declared) > self.max_bytes:
            await self._refuse(send)
            return
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away
            body += message.get("body", b"")
            if len(body) > self.max_bytes:
                await self._refuse(send)
                return
            if not message.get("more_body", False):
                break
        await self.app(scope, _replay(bytes(body), receive), send)

    async def _refuse(self, send: Any) -> None:
        detail = f"the request body is over {self.max_bytes} bytes: split the batch"
        payload = b'{"detail": "' + detail.encode() + b'"}'
        headers = [(b"content-type", b"application/json"), (b"connection", b"close")]
        headers.append((b"content-length", str(len(payload)).encode()))
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": payload})


def _replay(body: bytes, receive: Any) -> Any:
    """A `receive` that gives `body` once, then whatever the connection says next."""
    sent = False

    async def replayed() -> dict:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replayed


def _size_problem(max_length: int, lists: dict[str, list[str]]) -> str | None:
    """Why the lists of a request are too large to score (a 413's message), or None."""
    for name, texts in lists.items():
        if len(texts) > MAX_ITEMS:
            return f"at most {MAX_ITEMS} items per request, got {len(texts)}: split the batch"
        for i, text in enumerate(texts):
            if len(text) > MAX_TEXT_CHARS:
                return (
                    f"{name}[{i}] has {len(text)} characters, at most {MAX_TEXT_CHARS}: the "
                    f"models read only the first {max_length} tokens, so cut it before sending"
                )
    return None


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


def _require_token(app: Any, token: str) -> None:
    """401 for every request of `app` without `token` as its bearer token."""
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


def create_app(
    reward: ScoringModel,
    cost: ScoringModel,
    max_wait_s: float = 0.01,
    token: str | None = None,
    wait_timeout_s: float = WAIT_TIMEOUT_S,
) -> Any:
    """The FastAPI application around a loaded reward and cost model; requests arriving
    within `max_wait_s` of each other share forward passes (RequestBatcher), and wait at
    most `wait_timeout_s` for them. With `token`, every request without it as a bearer token
    gets 401 before any endpoint runs."""
    fastapi = require("fastapi", "scorer", SERVICE)
    FastAPI, HTTPException = fastapi.FastAPI, fastapi.HTTPException

    app = FastAPI(title="ES Lab scorer")
    app.add_middleware(BodyLimit, max_bytes=MAX_BODY_BYTES)
    batcher = RequestBatcher(
        reward, cost, max_wait_s=max_wait_s, max_items=MAX_ITEMS, wait_timeout_s=wait_timeout_s
    )

    if token is not None:
        _require_token(app, token)

    def checked_size(**lists: list[str]) -> None:
        problem = _size_problem(reward.max_length, lists)
        if problem is not None:
            raise HTTPException(413, problem)

    def scored(prompts: list[str], responses: list[str]) -> ScoreResponse:
        try:
            rewards, costs = batcher.score(prompts, responses)
        except BatcherTimeout as exc:
            raise HTTPException(503, str(exc), headers={"Retry-After": "10"}) from exc
        return ScoreResponse(rewards=rewards, costs=costs)

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
        checked_size(prompts=request.prompts, responses=request.responses)
        return scored(request.prompts, request.responses)

    @app.post("/score_texts", response_model=ScoreResponse)
    def score_texts(request: ScoreTextsRequest) -> ScoreResponse:
        checked_size(texts=request.texts)
        try:
            pairs = [split_text(text, i) for i, text in enumerate(request.texts)]
        except ConversationFormatError as exc:
            raise HTTPException(422, str(exc)) from exc
        return scored([p for p, _ in pairs], [r for _, r in pairs])

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
