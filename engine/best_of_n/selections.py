"""Every best-of-n curve of one scoring: each ensemble member alone and the ensemble under each
rule, as tlc4418/llm_optimization's `run_bon_pipeline.py --ensembles --uwo-weights ...` reports
them (one result per seed, then mean, WCO and one UWO per weight), from member scores computed
once.

The ensemble rules are engine/scoring/ensembles.py's with the reference's best-of-n variance
(`np.var`, BON_DDOF). Two of the reference's habits are not kept, and docs/algorithms.md says
so: it reads a UWO weight of 0 as "no weight" and falls back to a weight of 1 (`if weight`),
where here 0 is 0 (UWO is then the mean); and its ensembles leave the gold scores in the first
seed's order (engine/best_of_n/estimator.py re-orders them with the proxy).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from engine import metrics as mk
from engine.best_of_n.estimator import BonPoint, best_of_n
from engine.config import ConfigError, FieldError
from engine.scoring.ensembles import BON_DDOF, combine


def check_uwo_weights(weights: Sequence[float], members: int) -> None:
    """UWO weights are finite, non-negative and distinct, and need an ensemble to weigh;
    ConfigError naming --uwo-weights otherwise."""
    problem = None
    if weights and members < 2:
        problem = f"need an ensemble of at least 2 reward models, got {members}"
    elif bad := [w for w in weights if not (math.isfinite(w) and w >= 0)]:
        problem = f"must be finite and >= 0, got {bad}"
    elif len({mk.bon_key("uwo", w) for w in weights}) != len(weights):
        problem = f"must be distinct, got {list(weights)}"
    if problem:
        raise ConfigError([FieldError("uwo_weights", f"--uwo-weights {problem}")])


def best_of_n_selections(
    members: Mapping[str, np.ndarray],
    gold: np.ndarray,
    ns: list[int],
    uwo_weights: Sequence[float] = (),
) -> dict[str, list[BonPoint]]:
    """Curves keyed by mk.bon_key: every member's, then (with 2 or more members) the
    ensemble's mean, min and uwo at each weight; members: name -> scores [prompts, N]."""
    if not members:
        raise ValueError("best-of-n needs at least one proxy reward model's scores")
    check_uwo_weights(uwo_weights, len(members))
    curves = {
        mk.bon_key("member", name): best_of_n(scores, gold, ns) for name, scores in members.items()
    }
    if len(members) < 2:
        return curves
    stacked = np.stack([np.asarray(s, dtype=np.float64) for s in members.values()])
    rules: list[tuple[str, str, float]] = [
        (mk.bon_key("mean"), "mean", 0.0),
        (mk.bon_key("min"), "min", 0.0),
        *((mk.bon_key("uwo", w), "uwo", w) for w in uwo_weights),
    ]
    for key, method, weight in rules:
        curves[key] = best_of_n(combine(stacked, method, weight, ddof=BON_DDOF), gold, ns)
    return curves
