"""The unbiased best-of-n estimator against brute force over every n-subset."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from engine.best_of_n.estimator import best_of_n, selection_weights


def brute_force(proxy: np.ndarray, gold: np.ndarray, n: int) -> tuple[float, float]:
    """Mean over prompts and over all n-subsets of the (proxy, gold) of the best by proxy."""
    proxies, golds = [], []
    for p, g in zip(proxy, gold, strict=True):
        picks = [
            max(subset, key=lambda i: (p[i], i))
            for subset in itertools.combinations(range(len(p)), n)
        ]
        proxies.append(np.mean([p[i] for i in picks]))
        golds.append(np.mean([g[i] for i in picks]))
    return float(np.mean(proxies)), float(np.mean(golds))


@pytest.mark.parametrize("ties", [False, True])
def test_estimator_equals_brute_force_enumeration(ties):
    rng = np.random.default_rng(0)
    proxy = rng.normal(size=(3, 7))
    if ties:
        proxy = np.round(proxy)  # many equal proxy scores: ties go to the higher index
    gold = rng.normal(size=(3, 7))  # unrelated to the proxy: re-ordering errors would show
    points = best_of_n(proxy, gold, [1, 2, 3, 5, 7])
    for point in points:
        want_proxy, want_gold = brute_force(proxy, gold, point.n)
        assert point.proxy_score == pytest.approx(want_proxy)
        assert point.gold_score == pytest.approx(want_gold)


def test_weights_are_a_distribution_and_n_equals_n_picks_the_best():
    for n in (1, 4, 10):
        assert selection_weights(10, n).sum() == pytest.approx(1.0)
    assert selection_weights(10, 10).tolist() == [0.0] * 9 + [1.0]
    assert selection_weights(12600, 8192).sum() == pytest.approx(1.0)  # no overflow


def test_bad_n_and_shapes_are_refused():
    with pytest.raises(ValueError, match=r"n must be in 1\.\.N"):
        selection_weights(4, 5)
    with pytest.raises(ValueError, match="one shape"):
        best_of_n(np.zeros((2, 3)), np.zeros((2, 4)), [1])
