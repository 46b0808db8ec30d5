"""The unbiased best-of-n estimator: expected proxy and gold score of the answer a proxy
reward model picks among n, computed from N >= n sampled answers per prompt.

tlc4418/llm_optimization `src/bon/bon_sampling.py` (Coste et al. 2023, arXiv 2310.02743;
docs/algorithms.md, "Best-of-n"): sort a prompt's N answers by proxy score ascending; the i-th
(1-based) is the best of a uniformly drawn n-subset with probability C(i-1, n-1) / C(N, n),
so E[score of best-of-n] = sum_{i=n}^{N} C(i-1, n-1) / C(N, n) * s_(i), averaged over prompts.

The gold scores are re-ordered with the same permutation as the proxy scores (the reference's
ensemble path sorts the proxy scores but leaves the gold ones in another order). Ties in the
proxy score are broken by answer index (a stable sort), so the estimate equals the mean over
all n-subsets of the score of the subset's answer with the highest (proxy, index).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


def selection_weights(big_n: int, n: int) -> np.ndarray:
    """[N] probabilities that the i-th answer in ascending proxy order is the best of n."""
    if not 1 <= n <= big_n:
        raise ValueError(f"n must be in 1..N ({big_n}), got {n}")
    # log C(i-1, n-1) - log C(N, n) with lgamma: exact binomials overflow floats at N ~ 1e4.
    log_total = _log_comb(big_n, n)
    return np.array(
        [
            math.exp(_log_comb(i - 1, n - 1) - log_total) if i >= n else 0.0
            for i in range(1, big_n + 1)
        ]
    )


def _log_comb(a: int, b: int) -> float:
    return math.lgamma(a + 1) - math.lgamma(b + 1) - math.lgamma(a - b + 1)


@dataclass(frozen=True)
class BonPoint:
    n: int
    proxy_score: float
    gold_score: float


def best_of_n(proxy: np.ndarray, gold: np.ndarray, ns: list[int]) -> list[BonPoint]:
    """Expected proxy and gold score of best-of-n for each n; proxy, gold: [prompts, N]."""
    p = np.atleast_2d(np.asarray(proxy, dtype=np.float64))
    g = np.atleast_2d(np.asarray(gold, dtype=np.float64))
    if p.shape != g.shape:
        raise ValueError(f"proxy and gold scores must have one shape, got {p.shape} and {g.shape}")
    if not (np.isfinite(p).all() and np.isfinite(g).all()):
        raise ValueError("best-of-n needs finite proxy and gold scores")
    order = np.argsort(p, axis=1, kind="stable")  # [P, N]
    p_sorted = np.take_along_axis(p, order, axis=1)
    g_sorted = np.take_along_axis(g, order, axis=1)  # the same permutation as the proxy
    points = []
    for n in ns:
        w = selection_weights(p.shape[1], n)  # [N]
        points.append(
            BonPoint(
                n=n,
                proxy_score=float((p_sorted @ w).mean()),
                gold_score=float((g_sorted @ w).mean()),
            )
        )
    return points
