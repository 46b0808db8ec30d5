"""The scorer HTTP service: `GET /health`, `POST /score_batch {prompts, responses}` ->
`{rewards, costs}` (the reference's endpoints), served by uvicorn.

Requests are validated (two lists of strings of one length, at most MAX_ITEMS) before any
model runs; requests that arrive together are merged (scorer/batcher.py) and scored
in micro-batches of `batch_size` pairs.
"""

from __future__ import annotations

from typing import Any

from engine.extras import require
from scorer.batcher import RequestBatcher
from scorer.models import ScoringModel

SERVICE = "the scorer service"
BaseModel = require("pydantic", "scorer", SERVICE).BaseModel
MAX_ITEMS = 4096


# Module level, not inside create_app: FastAPI resolves the (postponed) annotations of the
# endpoints in the module's namespace.
class ScoreRequest(BaseModel):
    prompts: list[str]
    responses: list[str]


class ScoreResponse(BaseModel):
    rewards: list[float]
    costs: list[float]


def create_app(reward: ScoringModel, cost: ScoringModel, max_wait_s: float = 0.01) -> Any:
    """The FastAPI application around a loaded reward and cost model; requests arriving
    within `max_wait_s` of each other share forward passes (RequestBatcher)."""
    fastapi = require("fastapi", "scorer", SERVICE)
    FastAPI, HTTPException = fastapi.FastAPI, fastapi.HTTPException

    app = FastAPI(title="ES Lab scorer")
    batcher = RequestBatcher(reward, cost, max_wait_s=max_wait_s, max_items=MAX_ITEMS)

    @app.get("/health")
    def health() -> dict[str, Any]:
        return {
            "status": "ok",
            "reward_model": reward.path,
            "cost_model": cost.path,
            "requests": batcher.requests,
            "rounds": batcher.rounds,
        }

    @app.post("/score_batch", response_model=ScoreResponse)
    def score_batch(request: ScoreRequest) -> ScoreResponse:
        # A plain `def` runs in FastAPI's thread pool, so a long batch does not block /health.
        if len(request.prompts) != len(request.responses):
            raise HTTPException(
                422,
                f"prompts and responses must have one length, got "
                f"{len(request.prompts)} and {len(request.responses)}",
            )
        if len(request.prompts) > MAX_ITEMS:
            raise HTTPException(
                413,
                f"at most {MAX_ITEMS} pairs per request, got "
                f"{len(request.prompts)}: split the batch",
            )
        rewards, costs = batcher.score(request.prompts, request.responses)
        return ScoreResponse(rewards=rewards, costs=costs)

    return app


def serve(
    reward_model: str,
    cost_model: str,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    batch_size: int = 32,
    max_length: int = 256,
) -> None:
    """Load both models and serve until interrupted (`eslab scorer serve`)."""
    uvicorn = require("uvicorn", "scorer", SERVICE)

    reward = ScoringModel(reward_model, batch_size=batch_size, max_length=max_length)
    cost = ScoringModel(cost_model, batch_size=batch_size, max_length=max_length)
    print(
        f"scorer: reward model {reward_model}, cost model {cost_model}; "
        f"http://{host}:{port}/score_batch",
        flush=True,
    )
    uvicorn.run(create_app(reward, cost), host=host, port=port, log_level="warning")
