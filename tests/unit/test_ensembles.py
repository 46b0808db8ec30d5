"""Ensemble combinations (mean, worst-case, uncertainty-weighted), hand-computed."""

from __future__ import annotations

import numpy as np
import pytest

from engine.scoring.ensembles import BON_DDOF, METHODS, combine

# 3 members x 2 samples
S = np.array([[1.0, 4.0], [2.0, 0.0], [6.0, 2.0]])


def test_mean_and_min():
    assert combine(S, "mean").tolist() == [3.0, 2.0]
    assert combine(S, "min").tolist() == [1.0, 0.0]


def test_uwo_uses_unbiased_variance_for_training_and_ddof0_for_bon():
    # sample 0: mean 3, deviations -2, -1, 3 -> sum of squares 14: var 7 (ddof 1), 14/3 (ddof 0)
    assert combine(S, "uwo", uwo_weight=0.5)[0] == pytest.approx(3.0 - 0.5 * 7.0)
    assert combine(S, "uwo", uwo_weight=0.5, ddof=BON_DDOF)[0] == pytest.approx(3.0 - 0.5 * 14 / 3)


def test_every_method_of_one_member_equals_it_but_uwo_needs_two():
    for method in ("mean", "min"):
        assert combine(S[:1], method).tolist() == S[0].tolist()
    assert set(METHODS) == {"mean", "min", "uwo"}
    with pytest.raises(ValueError, match="needs more than 1 ensemble members"):
        combine(S[:1], "uwo")


def test_unknown_method_is_named():
    with pytest.raises(ValueError, match="unknown ensemble method 'max'"):
        combine(S, "max")
