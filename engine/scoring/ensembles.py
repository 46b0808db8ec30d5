"""Combining the scores of several reward models (or reward functions) into one reward.

After tlc4418/llm_optimization, "Reward Model Ensembles Help Mitigate Overoptimization"
(Coste et al. 2023, arXiv 2310.02743; `src/reward_modeling/scoring/ppo_reward_functions.py`
and `src/bon/ensemble_rm.py`), over k members' scores r_1..r_k of one sample:
- mean: mean_k r_k
- min (worst-case optimization, WCO): min_k r_k
- uwo (uncertainty-weighted optimization): mean_k r_k - w * Var_k r_k

The reference computes the variance two ways: unbiased (`torch.var`) in its PPO reward
functions and ddof 0 (`np.var`) in best-of-n. Training uses the PPO form (TRAINING_DDOF, which
needs k >= 2; engine/scoring/sources.py); `eslab bon` scores its proxy with BON_DDOF
(engine/best_of_n/evaluation.py).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

METHODS = ("mean", "min", "uwo")
TRAINING_DDOF = 1  # torch.var, the reference's PPO objectives
BON_DDOF = 0  # np.var, the reference's best-of-n ensembles


def _mean(s: np.ndarray, weight: float, ddof: int) -> np.ndarray:
    return s.mean(axis=0)


def _min(s: np.ndarray, weight: float, ddof: int) -> np.ndarray:
    return s.min(axis=0)


def _uwo(s: np.ndarray, weight: float, ddof: int) -> np.ndarray:
    if s.shape[0] <= ddof:
        raise ValueError(
            f"uwo with ddof {ddof} needs more than {ddof} ensemble members, got {s.shape[0]}"
        )
    return s.mean(axis=0) - weight * s.var(axis=0, ddof=ddof)


_COMBINERS: dict[str, Callable[[np.ndarray, float, int], np.ndarray]] = {
    "mean": _mean,
    "min": _min,
    "uwo": _uwo,
}


def combine(
    scores: np.ndarray, method: str, uwo_weight: float = 0.1, ddof: int = TRAINING_DDOF
) -> np.ndarray:
    """Combine `scores` [k, ...] (members first) into one score per sample [...]."""
    if method not in _COMBINERS:
        raise ValueError(f"unknown ensemble method {method!r}: choose one of {', '.join(METHODS)}")
    s = np.asarray(scores, dtype=np.float64)
    if s.ndim == 0 or s.shape[0] == 0:
        raise ValueError("an ensemble needs at least one member's scores")
    return _COMBINERS[method](s, uwo_weight, ddof)
