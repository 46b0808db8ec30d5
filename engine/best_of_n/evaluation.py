"""Best-of-n evaluation of a model (a run's checkpoint): proxy vs gold score as n grows.

For each prompt of the run's eval (or train) set the model samples N answers at temperature
1; a proxy reward (by default the run's own: its scorer, ensemble or reward function) and a
gold reward (any reward source: a function path, `scorer`, or a scorer URL) score every
answer, and the unbiased estimator (engine/best_of_n/estimator.py) gives the expected proxy
and gold score of the proxy's pick among n. Over-optimisation shows as a proxy curve that keeps
rising while the gold curve flattens or falls (Coste et al. 2023, Fig. 1).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np

from engine.best_of_n.estimator import BonPoint, best_of_n
from engine.config import RunConfig
from engine.data.datasets import Example, load_dataset
from engine.model_files import ModelError
from engine.paths import resolve_path
from engine.scoring.ensembles import BON_DDOF
from engine.scoring.sources import RewardSources

RUN_PROXY = "run"
# engine/trainer/checkpoints.py writes it; read here without importing vLLM
STATE_FILE = "trainer_state.json"


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
    a = config.alignment
    return RewardSources(
        reward_source="ensemble",
        reward_func_path=None,
        scorer_url=a.scorer_url if spec == "scorer" else None,
        members=(spec,),
        scorer_batch_size=a.scorer_batch_size,
        scorer_timeout_s=a.scorer_timeout_s,
        scorer_retries=a.scorer_retries,
        ensemble_ddof=BON_DDOF,
    )


def evaluate_best_of_n(
    checkpoint: Path,
    gold: str,
    ns: list[int],
    *,
    proxy: str = RUN_PROXY,
    samples: int | None = None,
    max_prompts: int = 16,
    log: Callable[[str], None] = print,
) -> list[BonPoint]:
    from engine.backends.vllm.engine import VLLMEngine

    config = checkpoint_config(checkpoint)
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
    proxy_scores = source_for(proxy, config).score(outputs, prompts, args, "best-of-n").rewards
    gold_scores = source_for(gold, config).score(outputs, prompts, args, "best-of-n").rewards
    return best_of_n(np.asarray(proxy_scores), np.asarray(gold_scores), ns)


def write_points(points: list[BonPoint], path: Path) -> Path:
    """The reference's bon_sampled_results.json layout: [{n, proxy_score, gold_score}]."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps(
            [{"n": p.n, "proxy_score": p.proxy_score, "gold_score": p.gold_score} for p in points],
            indent=2,
        )
    )
    return path
