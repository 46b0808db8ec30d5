"""The alignment objective and the Lagrangian lambda rule, against hand-computed values."""

from __future__ import annotations

import math

import numpy as np
import pytest

from engine.alignment.lagrangian import (
    LambdaRule,
    LambdaState,
    Objective,
    objective,
    safe_ratio,
    update_lambda,
)

R = np.array([1.0, 2.0, 3.0, -1.0])
C = np.array([0.5, -1.0, 2.0, -0.5])


def test_plain_objective_is_mean_reward_minus_lambda_mean_cost():
    # mean R = 1.25, mean C = 0.25
    assert objective(R, C, Objective(lambda_value=2.0)) == pytest.approx(1.25 - 2.0 * 0.25)


def test_safe_first_gates_the_reward_of_unsafe_answers():
    # C > 0 at 0 and 2: r_eff = [0, 2, 0, -1] (hard gate) or [0.5, 2, 1.5, -1] (factor 0.5)
    hard = objective(R, C, Objective(lambda_value=1.0, safe_first=True))
    soft = objective(R, C, Objective(lambda_value=1.0, safe_first=True, safe_first_factor=0.5))
    assert hard == pytest.approx(0.25 - 0.25)
    assert soft == pytest.approx(0.75 - 0.25)


def test_standardize_divides_the_means_by_their_std_without_centering():
    got = objective(R, C, Objective(lambda_value=0.5, standardize_within_batch=True))
    r_std, c_std = np.std(R) + 1e-8, np.std(C) + 1e-8
    assert got == pytest.approx(1.25 / r_std - 0.5 * 0.25 / c_std)


def test_objective_refuses_mismatched_lengths():
    with pytest.raises(ValueError, match="one length"):
        objective(R, C[:3], Objective(lambda_value=1.0))


def test_safe_ratio_counts_cost_at_most_zero():
    assert safe_ratio(np.array([0.0, -1.0, 0.1, 3.0])) == 0.5


def test_lambda_steps_by_hand():
    rule = LambdaRule(
        lambda_lr=0.1, lambda_min=1e-4, lambda_max=10.0, cost_threshold_d=0.5, ema_beta=0.9
    )
    state = LambdaState(value=1.0)
    # step 1: J_C = mean([1, 2]) - 0.5 = 1.0; the average starts at J_C; ln l = 0 + 0.1 * 1
    first = update_lambda(state, np.array([1.0, 2.0]), rule)
    assert (first.jc_raw, first.jc, first.jc_smoothed) == (1.0, 1.0, 1.0)
    assert first.state.value == pytest.approx(math.exp(0.1))
    # step 2: J_C = -0.5 - 0.5 = -1.0; J = 0.9 * 1 + 0.1 * -1 = 0.8; ln l = 0.1 + 0.08
    second = update_lambda(first.state, np.array([-0.5]), rule)
    assert second.jc_raw == pytest.approx(-1.0)
    assert second.jc_smoothed == pytest.approx(0.8)
    assert second.state.value == pytest.approx(math.exp(0.18))


def test_lambda_falls_when_the_cost_is_below_the_threshold():
    update = update_lambda(LambdaState(1.0), np.array([-2.0, -1.0]), LambdaRule(lambda_lr=0.5))
    assert update.state.value == pytest.approx(math.exp(-0.75))


def test_positive_cost_only_takes_the_positive_part_of_j_c():
    rule = LambdaRule(lambda_lr=0.5, positive_cost_only=True)
    update = update_lambda(LambdaState(2.0), np.array([-3.0, 1.0]), rule)
    assert update.jc_raw == -1.0 and update.jc == 0.0 and update.jc_smoothed == 0.0
    assert update.state.value == pytest.approx(2.0)  # never falls below where it is


def test_lambda_is_clipped_to_its_range():
    up = update_lambda(LambdaState(9.0), np.array([100.0]), LambdaRule(lambda_lr=1.0))
    assert up.state.value == 10.0
    down = update_lambda(LambdaState(1e-4), np.array([-100.0]), LambdaRule(lambda_lr=1.0))
    assert down.state.value == 1e-4
