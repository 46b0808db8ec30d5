"""The alignment objective F = mean(R) - lambda * mean(C) and the Lagrangian lambda rule.

After the alignment script of the jbejjani2022 fork of es-fine-tuning-paper
(`alignment/ES/es-fine-tuning_alignment_accl_api.py`; docs/algorithms.md, "Alignment"),
which follows the Safe-RLHF objective: each population member
is scored by its batch means of reward R (helpfulness) and cost C (harmfulness, C > 0 is
unsafe), and lambda is a Lagrange multiplier on the constraint E[C] <= d, updated in log space
from the unperturbed model's costs after every step.

Two differences from that code, on purpose:
- J_C = mean(C) - d. The code adds d (its help text says "J_C = E[C] + d"), which only agrees
  with the constraint E[C] <= d at its default d = 0; minus d keeps the rule a Lagrangian
  step on that constraint for every d.
- A scorer failure never becomes a zero score (engine/scoring/client.py raises instead).

Everything here is a pure function on plain arrays; the state that lambda carries from step
to step is an immutable `LambdaState` that goes in and comes out (as evosax strategies do).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

STD_EPS = 1e-8  # the reference's `std() + 1e-8`


@dataclass(frozen=True)
class Objective:
    """How a member's rewards and costs become one fitness value."""

    lambda_value: float
    standardize_within_batch: bool = False
    safe_first: bool = False
    safe_first_factor: float = 0.0


def objective(rewards: np.ndarray, costs: np.ndarray, obj: Objective) -> float:
    """F = mean(r_eff) - lambda * mean(C) over one member's samples.

    safe_first: r_eff = safe_first_factor * R where C > 0 (0 is a hard gate), else R.
    standardize_within_batch: both means are divided by their batch std (population std,
    + 1e-8) without centering, as the reference does, so R and C enter on the same scale.
    """
    r = np.asarray(rewards, dtype=np.float64).reshape(-1)
    c = np.asarray(costs, dtype=np.float64).reshape(-1)
    if r.shape != c.shape or r.size == 0:
        raise ValueError(
            f"rewards and costs must be non-empty and of one length, got "
            f"{r.size} rewards and {c.size} costs"
        )
    r_eff = np.where(c > 0.0, obj.safe_first_factor * r, r) if obj.safe_first else r
    r_mean, c_mean = float(r_eff.mean()), float(c.mean())
    if obj.standardize_within_batch:
        r_mean /= float(r_eff.std()) + STD_EPS
        c_mean /= float(c.std()) + STD_EPS
    return r_mean - obj.lambda_value * c_mean


def safe_ratio(costs: np.ndarray) -> float:
    """Share of responses with cost <= 0 (the Safe-RLHF definition of a safe response)."""
    c = np.asarray(costs, dtype=np.float64).reshape(-1)
    return float(np.mean(c <= 0.0))


@dataclass(frozen=True)
class LambdaRule:
    """Settings of the Lagrangian update (the reference's flags, same defaults)."""

    lambda_lr: float = 0.01
    lambda_min: float = 1e-4
    lambda_max: float = 10.0
    cost_threshold_d: float = 0.0
    positive_cost_only: bool = False
    ema_beta: float = 0.9


@dataclass(frozen=True)
class LambdaState:
    """lambda now, and the moving average of J_C (None before the first update)."""

    value: float
    jc_smoothed: float | None = None


@dataclass(frozen=True)
class LambdaUpdate:
    """What one update saw and did, for the step's metrics."""

    jc_raw: float  # mean(C) - d
    jc: float  # jc_raw, or its positive part with positive_cost_only
    jc_smoothed: float  # the moving average that moved ln(lambda)
    state: LambdaState  # lambda for the next step


def update_lambda(state: LambdaState, base_costs: np.ndarray, rule: LambdaRule) -> LambdaUpdate:
    """One step of the rule, from the unperturbed model's costs on the step's prompts.

    J_C = mean(C) - d (max(J_C, 0) with positive_cost_only); J <- beta * J + (1 - beta) * J_C
    (J starts at the first J_C); ln(lambda) += lambda_lr * J; lambda clipped to
    [lambda_min, lambda_max]. The caller applies the new lambda from the next step on.
    """
    c = np.asarray(base_costs, dtype=np.float64).reshape(-1)
    if c.size == 0:
        raise ValueError("the lambda update needs at least one cost")
    jc_raw = float(c.mean()) - rule.cost_threshold_d
    jc = max(jc_raw, 0.0) if rule.positive_cost_only else jc_raw
    smoothed = (
        jc
        if state.jc_smoothed is None
        else (rule.ema_beta * state.jc_smoothed + (1.0 - rule.ema_beta) * jc)
    )
    ln_lambda = math.log(max(state.value, 1e-12)) + rule.lambda_lr * smoothed
    value = min(max(math.exp(ln_lambda), rule.lambda_min), rule.lambda_max)
    return LambdaUpdate(
        jc_raw=jc_raw,
        jc=jc,
        jc_smoothed=smoothed,
        state=LambdaState(value=value, jc_smoothed=smoothed),
    )
