"""Best-of-n evaluation of a model (a run's checkpoint): proxy vs gold score as n grows.

For each prompt of the run's eval (or train) set the model samples N answers at temperature
1; a proxy reward (by default the run's own: its scorer, ensemble or reward function) and a
gold reward (any reward source: a function path, `scorer`, or a scorer URL) score every
answer, and the unbiased estimator (engine/best_of_n/estimator.py) gives the expected proxy
and gold score of the proxy's pick among n. Over-optimisation shows as a proxy curve that keeps
rising while the gold curve flattens or falls (Coste et al. 2023, Fig. 1).

Pre-labelled answers (evaluate_gold_generations) skip the sampling and the gold reward. Either
way the proxy scores every answer once, and each of its members and ensemble rules gives its
own curve (engine/best_of_n/selections.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from engine.backends.base import Completion
from engine.best_of_n.estimator import BonPoint
from engine.best_of_n.gold_generations import read_gold_generations
from engine.best_of_n.selections import best_of_n_selections, check_uwo_weights
from engine.config import AlignmentConfig, ConfigError, EnsembleConfig, FieldError, RunConfig
from engine.data.datasets import Example, load_dataset
from engine.model_files import ModelError
from engine.paths import resolve_path
from engine.prompts import Prompt
from engine.scoring.ensembles import BON_DDOF
from engine.scoring.members import SCORER_MEMBER, parse_members
from engine.scoring.sources import RewardSources, member_part

RUN_PROXY = "run"
PROXY = "proxy"  # the member name of a proxy that is not an ensemble
# engine/trainer/checkpoints.py writes it; read here without importing vLLM
STATE_FILE = "trainer_state.json"


@dataclass(frozen=True)
class ProxyMembers:
    """The proxy reward models, known by name before anything is sampled; `score` scores every
    answer once: member name -> scores [prompts, N] (one member for a single reward model,
    each member's own for an ensemble)."""

    names: tuple[str, ...]
    score: Callable[
        [list[Prompt], list[list[Completion]], list[dict[str, Any]]], dict[str, np.ndarray]
    ]


Curves = dict[str, list[BonPoint]]


def checkpoint_config(checkpoint: Path) -> RunConfig:
    """The run configuration stored in a checkpoint-STEP/ folder."""
    state = checkpoint / STATE_FILE
    if not state.is_file():
        raise ModelError(f"{checkpoint} is not a checkpoint folder: {STATE_FILE} is missing")
    return RunConfig.from_flat(json.loads(state.read_text())["config"])


def source_for(spec: str, config: RunConfig) -> RewardSources:
    """`run` -> the run's own reward; otherwise one reward source (path, `scorer`, URL).

    An ensemble's uwo uses the variance of the reference's best-of-n (`np.var`, BON_DDOF),
    not training's unbiased one: the same run's proxy scores differ between the two."""
    if spec == RUN_PROXY:
        own = RewardSources.from_config(config)
        if own is not None:
            return replace(own, ensemble_ddof=BON_DDOF)
        spec = config.reward.reward_func_path or ""
    return spec_source(spec, config.alignment)


def spec_source(spec: str, alignment: AlignmentConfig | None = None) -> RewardSources:
    """Reward sources as `ensemble_members` names them, comma-separated: function paths,
    `scorer` (the alignment's scorer_url) or scorer URLs (one service per seed's reward model
    makes a per-seed ensemble), with the alignment's scorer settings (the defaults without a
    run)."""
    a = alignment or AlignmentConfig()
    members = tuple(parse_members(spec))
    problem = None
    if not members:
        problem = "names no reward"
    elif len(set(members)) != len(members):
        problem = f"names a reward twice ({spec!r})"
    elif SCORER_MEMBER in members and a.scorer_url is None:
        problem = "says `scorer`, a run's scorer_url, and there is none: give the scorer's URL"
    if problem:
        raise ConfigError([FieldError("reward", f"the reward {problem}")])
    return RewardSources(
        reward_source="ensemble",
        reward_func_path=None,
        scorer_url=a.scorer_url if SCORER_MEMBER in members else None,
        members=members,
        scorer_batch_size=a.scorer_batch_size,
        scorer_timeout_s=a.scorer_timeout_s,
        scorer_retries=a.scorer_retries,
        ensemble_ddof=BON_DDOF,
    )


def source_members(source: RewardSources) -> ProxyMembers:
    """A reward source as ProxyMembers: an ensemble's members, or a single source as `proxy`."""

    def score(
        prompts: list[Prompt], outputs: list[list[Completion]], args: list[dict[str, Any]]
    ) -> dict[str, np.ndarray]:
        batch = source.score(outputs, prompts, args, "best-of-n")
        if source.reward_source != "ensemble":
            return {PROXY: batch.rewards}
        return {name: batch.parts[member_part(name)] for name in source.member_names()}

    ensemble = source.reward_source == "ensemble"
    return ProxyMembers(tuple(source.member_names()) if ensemble else (PROXY,), score)


def evaluate_best_of_n(
    checkpoint: Path,
    gold: str,
    ns: list[int],
    *,
    proxy: str = RUN_PROXY,
    proxy_members: ProxyMembers | None = None,
    uwo_weights: Sequence[float] | None = None,
    samples: int | None = None,
    max_prompts: int = 16,
    log: Callable[[str], None] = print,
) -> Curves:
    """Sample the checkpoint's answers and score them once with the proxy (`proxy_members`,
    else the reward source `proxy`) and the gold reward; uwo_weights default to the run's."""
    from engine.backends.vllm.engine import VLLMEngine

    config = checkpoint_config(checkpoint)
    members = proxy_members or source_members(source_for(proxy, config))
    weights = _weights(uwo_weights, members, config.ensemble.uwo_weight)
    big_n = samples or max(ns)
    if min(ns) < 1 or max(ns) > big_n:
        raise ModelError(f"every n must be in 1..samples ({big_n}), got {ns}")
    data_file = config.data.eval_file or config.data.train_file
    examples: list[Example] = load_dataset(
        resolve_path(data_file), expected_format=config.data.prompt_format
    )[:max_prompts]
    prompts = [e.prompt for e in examples]
    args = [e.reward_func_args for e in examples]
    log(f"best-of-n: {len(examples)} prompts of {data_file}, {big_n} samples each")
    engine = VLLMEngine(
        str(checkpoint),
        dtype=config.model.dtype,
        max_model_len=config.model.max_model_len,
        gpu_memory_utilization=config.model.gpu_memory_utilization,
        seed=config.data.seed,
    )
    try:
        outputs = engine.generate(
            prompts,
            n=big_n,
            temperature=1.0,
            max_tokens=config.sampling.max_tokens,
            seed=config.data.seed,
        )
    finally:
        engine.shutdown()
    scores = members.score(prompts, outputs, args)
    gold_scores = source_for(gold, config).score(outputs, prompts, args, "best-of-n").rewards
    return best_of_n_selections(scores, np.asarray(gold_scores), ns, weights)


def evaluate_gold_generations(
    path: Path,
    ns: list[int],
    proxy_members: ProxyMembers,
    *,
    uwo_weights: Sequence[float] | None = None,
    samples: int | None = None,
    log: Callable[[str], None] = print,
) -> Curves:
    """Best-of-n over the pre-labelled answers of `path` (engine/best_of_n/gold_generations.py):
    no sampling and no gold model, only the proxy's scoring of every answer, once."""
    weights = _weights(uwo_weights, proxy_members, EnsembleConfig().uwo_weight)
    data = read_gold_generations(path, samples)
    big_n = data.gold.shape[1]
    if min(ns) < 1 or max(ns) > big_n:
        raise ModelError(
            f"every n must be in 1..N ({big_n}, the answers per row of {path}), got {ns}"
        )
    log(f"best-of-n: {len(data.prompts)} prompts of {path}, {big_n} labelled answers each")
    outputs = [
        [Completion(text=a, num_tokens=0, finished=True) for a in row] for row in data.answers
    ]
    scores = proxy_members.score(list(data.prompts), outputs, [{} for _ in data.prompts])
    return best_of_n_selections(scores, data.gold, ns, weights)


def _weights(
    asked: Sequence[float] | None, members: ProxyMembers, default: float
) -> Sequence[float]:
    """The weights asked for, else `default` for an ensemble; checked before any sampling or
    scoring, so a bad weight costs nothing."""
    weights = asked if asked is not None else (default,) if len(members.names) > 1 else ()
    check_uwo_weights(weights, len(members.names))
    return weights


def _rows(points: list[BonPoint]) -> list[dict[str, float]]:
    return [{"n": p.n, "proxy_score": p.proxy_score, "gold_score": p.gold_score} for p in points]


def write_curves(curves: Curves, path: Path) -> Path:
    """One curve: the reference's bon_sampled_results.json layout, [{n, proxy_score,
    gold_score}]; several (an ensemble): {mk.bon_key: that layout}, one file for what the
    reference writes as one folder per seed and ensemble."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = {key: _rows(points) for key, points in curves.items()}
    path.write_text(json.dumps(next(iter(rows.values())) if len(rows) == 1 else rows, indent=2))
    return path


def read_curves(path: Path) -> dict[str, list[dict[str, float]]]:
    """What write_curves wrote, always keyed (a single curve under ""), for the dashboard."""
    data = json.loads(path.read_text())
    return {"": data} if isinstance(data, list) else data
