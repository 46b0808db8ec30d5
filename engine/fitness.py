"""Fitness shaping: raw population fitness -> advantages A_i for the ES update.

- `zscore`: (x - mean) / (std + eps) with the population std (ddof 0) and eps 1e-6, as
  nlp-waseda/lbes `src/es_trainer.py` (ES) and `src/lbes_trainer.py` (LBES, with
  nanmean/nanstd).
- `centered_rank`: OpenAI-ES centered ranks in [-0.5, 0.5] (Salimans et al. 2017), as
  evosax `centered_rank_fitness_shaping_fn` (ranks with ties averaged).

NaN fitness (LBES: a member whose correlation is undefined) never produces NaN advantages:
zscore gives it 0, so the update skips it, as the reference's update skips NaN advantages;
centered_rank ranks it last (worst), as evosax does on purpose. A population whose finite
fitness values are all equal has no direction to follow: both give exact zeros.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

Shaper = Callable[[np.ndarray], np.ndarray]

ZSCORE_EPS = 1e-6  # the reference's ADVANTAGE_STD_EPSILON


def zscore(x: np.ndarray, eps: float = ZSCORE_EPS) -> np.ndarray:
    """(x - mean) / (std + eps) over the finite entries; NaN (or infinite) entries get 0."""
    x = np.asarray(x, dtype=np.float64)  # [N]
    finite = np.isfinite(x)
    out = np.zeros_like(x)
    values = x[finite]
    # All-equal: the reference would return rounding noise of order 1e-17 / eps; exact zeros
    # let the update skip these members instead of applying that noise.
    if values.size == 0 or np.all(values == values[0]):
        return out
    out[finite] = (values - values.mean()) / (values.std() + eps)
    return out


def _average_ranks(x: np.ndarray) -> np.ndarray:
    """0-based ranks of x ascending, tied values sharing the mean of their ranks."""
    order = np.argsort(x, kind="stable")
    sorted_x = x[order]
    # Start index of each run of equal values in sorted order.
    starts = np.flatnonzero(np.r_[True, sorted_x[1:] != sorted_x[:-1]])
    ends = np.r_[starts[1:], x.size]
    ranks = np.empty(x.size, dtype=np.float64)
    for start, end in zip(starts, ends, strict=True):
        ranks[order[start:end]] = (start + end - 1) / 2.0
    return ranks


def centered_rank(x: np.ndarray) -> np.ndarray:
    """Ranks scaled to [-0.5, 0.5]: the best member gets 0.5, the worst -0.5.

    NaN entries rank below every finite value (they share the lowest ranks).
    """
    x = np.asarray(x, dtype=np.float64)  # [N]
    if x.size < 2:
        return np.zeros_like(x)
    # -inf puts NaN below every finite value, so NaN members count as the worst.
    ranks = _average_ranks(np.where(np.isnan(x), -np.inf, x))
    return ranks / (x.size - 1) - 0.5


SHAPERS: dict[str, Shaper] = {
    "zscore": zscore,
    "centered_rank": centered_rank,
}


def shape_fitness(name: str, x: np.ndarray) -> np.ndarray:
    """Shape population fitness `x` [N] with the shaper registered as `name`."""
    if name not in SHAPERS:
        raise ValueError(f"unknown fitness shaping {name!r}: choose one of {', '.join(SHAPERS)}")
    return SHAPERS[name](np.asarray(x, dtype=np.float64))


def macro_shape_fitness(name: str, rewards: np.ndarray) -> np.ndarray:
    """ES `macro_advantage`: shape each (prompt, sample) across the population, then average.

    rewards: [N, ...] (population first). With "zscore" this is the reference's
    `--macro_advantage` (z-score per (prompt, sample) over members, mean over the rest).
    """
    rewards = np.asarray(rewards, dtype=np.float64)
    columns = rewards.reshape(rewards.shape[0], -1)  # [N, B*n]
    shaped = np.stack([shape_fitness(name, columns[:, j]) for j in range(columns.shape[1])], axis=1)
    return shaped.mean(axis=1)
