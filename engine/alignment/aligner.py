"""What an alignment run adds to an ES step: fitness by the alignment objective, the lambda
update from the unperturbed model's costs, and the step's alignment metrics.

The unperturbed model is generated only when lambda adapts (`adapts`), as the reference does:
with `lambda_adapt` off a step costs the population's generations and nothing more.

The trainer holds one Aligner per run (engine/trainer/es_step.py); its lambda state goes
into every checkpoint (`snapshot`), so a resumed run continues with the same lambda and J_C
average. The rule itself is engine/alignment/lagrangian.py.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from engine import metrics as mk
from engine.alignment.lagrangian import (
    LambdaRule,
    LambdaState,
    Objective,
    objective,
    safe_ratio,
    update_lambda,
)
from engine.scoring.sources import COST

if TYPE_CHECKING:
    from engine.config import RunConfig
    from engine.scoring.batch import ScoredBatch
    from engine.sink import PopulationRecord


class Aligner:
    """Per-run alignment state; built only when the run has a scorer (costs to weigh)."""

    def __init__(self, config: RunConfig, snapshot: dict | None = None) -> None:
        a = config.alignment
        self.config = config
        self.rule = LambdaRule(
            lambda_lr=a.lambda_lr,
            lambda_min=a.lambda_min,
            lambda_max=a.lambda_max,
            cost_threshold_d=a.cost_threshold_d,
            positive_cost_only=a.lambda_pos_cost_only,
            ema_beta=a.jc_ema_beta,
        )
        self.state = (
            LambdaState(snapshot["lambda"], snapshot["jc_smoothed"])
            if snapshot
            else LambdaState(a.lambda_cost)
        )

    @classmethod
    def for_run(cls, config: RunConfig, snapshot: dict | None = None) -> Aligner | None:
        return cls(config, snapshot) if config.alignment.scorer_url is not None else None

    @property
    def adapts(self) -> bool:
        """Whether a step needs the unperturbed model's costs (only the lambda rule reads them)."""
        return self.config.alignment.lambda_adapt

    def snapshot(self) -> dict:
        return {"lambda": self.state.value, "jc_smoothed": self.state.jc_smoothed}

    def _objective(self) -> Objective:
        a = self.config.alignment
        return Objective(
            lambda_value=self.state.value,
            standardize_within_batch=a.standardize_within_batch,
            safe_first=a.safe_first,
            safe_first_factor=a.safe_first_factor,
        )

    def fitness(self, results: list[ScoredBatch]) -> np.ndarray:
        """[N] F_i = mean(R) - lambda * mean(C) of each member, with this step's lambda."""
        obj = self._objective()
        return np.array([objective(r.rewards, r.parts[COST], obj) for r in results])

    def eval_metrics(self, result: ScoredBatch) -> dict[str, float]:
        """The objective over the eval set's completions with lambda as it stands (after the
        latest step's update), as the reference's `eval/mean_combined`."""
        return {
            mk.EVAL_MEAN_COMBINED: objective(result.rewards, result.parts[COST], self._objective())
        }

    def adapt(self, base: ScoredBatch | None) -> dict[str, float]:
        """Update lambda from the unperturbed model's costs (it applies from the next step);
        returns the metrics of the step: lambda used, J_C raw and smoothed. `base` is None
        exactly when lambda does not adapt (nothing was generated for it)."""
        metrics = {mk.LAMBDA: self.state.value}
        if base is None:
            if self.adapts:
                raise ValueError("adapting lambda needs the unperturbed model's costs")
            return metrics
        update = update_lambda(self.state, base.parts[COST], self.rule)
        self.state = update.state
        return {
            **metrics,
            mk.JC_RAW: update.jc_raw,
            mk.JC: update.jc,
            mk.JC_SMOOTHED: update.jc_smoothed,
            mk.COST_THRESHOLD: self.rule.cost_threshold_d,
            mk.LAMBDA_NEXT: update.state.value,
            mk.BASE_COST_MEAN: float(np.mean(base.parts[COST])),
            mk.BASE_SAFE_RATIO: safe_ratio(base.parts[COST]),
        }

    @staticmethod
    def population_metrics(results: list[ScoredBatch], fitness: np.ndarray) -> dict[str, float]:
        costs = np.concatenate([r.parts[COST].reshape(-1) for r in results])
        return {
            mk.reward_key(mk.TRAIN, "objective", "mean"): float(fitness.mean()),
            mk.reward_key(mk.TRAIN, "objective", "std"): float(fitness.std()),
            mk.reward_key(mk.TRAIN, "objective", "min"): float(fitness.min()),
            mk.reward_key(mk.TRAIN, "objective", "max"): float(fitness.max()),
            mk.SAFE_RATIO: safe_ratio(costs),
        }

    @staticmethod
    def with_scores(
        population: list[PopulationRecord], results: list[ScoredBatch]
    ) -> list[PopulationRecord]:
        """Population rows carrying each member's mean reward and mean cost, and the reward and
        cost of each of its samples."""
        return [
            replace(
                p,
                reward=float(r.rewards.mean()),
                cost=float(r.parts[COST].mean()),
                sample_rewards=_finite_list(r.rewards),
                sample_costs=_finite_list(r.parts[COST]),
            )
            for p, r in zip(population, results, strict=True)
        ]


def _finite_list(scores: np.ndarray) -> list[float | None]:
    """[prompts, n] scores, row-major, None where not finite: JSON (PostgreSQL's above all)
    has no NaN."""
    return [float(x) if np.isfinite(x) else None for x in scores.reshape(-1)]
