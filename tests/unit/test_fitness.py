"""Fitness shaping against hand-computed values."""

import math

import numpy as np
import pytest

from engine.fitness import SHAPERS, centered_rank, macro_shape_fitness, shape_fitness, zscore

EPS = 1e-6


def test_zscore_uses_population_std():
    # mean 2, population std sqrt(2/3) (ddof 0, not the sample std 1)
    sd = math.sqrt(2 / 3)
    np.testing.assert_allclose(
        zscore(np.array([1.0, 2.0, 3.0])), [-1 / (sd + EPS), 0.0, 1 / (sd + EPS)], rtol=1e-12
    )


def test_zscore_eps_in_denominator():
    # mean 1, std 1: +-1 / (1 + eps)
    np.testing.assert_allclose(
        zscore(np.array([0.0, 2.0])), [-1 / (1 + EPS), 1 / (1 + EPS)], rtol=1e-12
    )
    np.testing.assert_allclose(zscore(np.array([0.0, 2.0]), eps=1.0), [-0.5, 0.5])


def test_zscore_nan_gets_zero_and_is_left_out_of_mean_and_std():
    # finite entries 1 and 3: mean 2, std 1
    out = zscore(np.array([1.0, np.nan, 3.0]))
    np.testing.assert_allclose(out, [-1 / (1 + EPS), 0.0, 1 / (1 + EPS)], rtol=1e-12)
    assert not np.isnan(out).any()


@pytest.mark.parametrize("values", [[0.1, 0.1, 0.1], [5.0], [np.nan, np.nan], [0.3, np.nan, 0.3]])
def test_zscore_no_spread_gives_exact_zeros(values):
    out = zscore(np.array(values))
    assert np.array_equal(out, np.zeros(len(values)))


def test_centered_rank_distinct():
    np.testing.assert_allclose(centered_rank(np.array([10.0, 30.0, 20.0])), [-0.5, 0.5, 0.0])


def test_centered_rank_ties_share_the_average_rank():
    # ranks 0, 1.5, 1.5, 3 over 3
    np.testing.assert_allclose(centered_rank(np.array([1.0, 2.0, 2.0, 3.0])), [-0.5, 0.0, 0.0, 0.5])


def test_centered_rank_nan_ranks_last():
    np.testing.assert_allclose(centered_rank(np.array([np.nan, 5.0, 1.0])), [-0.5, 0.5, 0.0])
    # two NaNs share ranks 0 and 1 -> 0.5; finite ranks 2, 3; all over 3
    np.testing.assert_allclose(
        centered_rank(np.array([np.nan, np.nan, 1.0, 2.0])), [-1 / 3, -1 / 3, 1 / 6, 0.5]
    )


def test_centered_rank_all_equal_and_singleton():
    assert np.array_equal(centered_rank(np.array([7.0, 7.0, 7.0, 7.0])), np.zeros(4))
    assert np.array_equal(centered_rank(np.array([7.0])), np.zeros(1))


@pytest.mark.parametrize("name", sorted(SHAPERS))
def test_every_shaper_preserves_order_and_centers(name):
    x = np.array([0.3, -2.0, 1.5, 0.0, 9.0])
    out = shape_fitness(name, x)
    assert out.shape == x.shape
    assert np.array_equal(np.argsort(out), np.argsort(x))
    assert out.sum() == pytest.approx(0.0, abs=1e-12)
    assert np.array_equal(shape_fitness(name, np.full(4, 2.5)), np.zeros(4))


def test_shape_fitness_unknown_name():
    with pytest.raises(ValueError, match=r"unknown fitness shaping 'rank'.*centered_rank"):
        shape_fitness("rank", np.array([1.0, 2.0]))


def test_macro_zscore_shapes_each_sample_across_the_population():
    # rewards [members=2, prompts=1, samples=2]
    rewards = np.array([[[1.0, 0.0]], [[3.0, 0.0]]])
    # sample 0: [1, 3] -> -+1/(1+eps); sample 1: [0, 0] -> 0; mean over samples
    np.testing.assert_allclose(
        macro_shape_fitness("zscore", rewards), [-0.5 / (1 + EPS), 0.5 / (1 + EPS)], rtol=1e-12
    )


def test_macro_centered_rank():
    rewards = np.array([[1.0, 9.0], [2.0, 8.0], [3.0, 7.0]])  # [members=3, samples=2]
    # sample 0 ranks -0.5, 0, 0.5; sample 1 ranks 0.5, 0, -0.5; means are 0
    np.testing.assert_allclose(macro_shape_fitness("centered_rank", rewards), [0.0, 0.0, 0.0])
