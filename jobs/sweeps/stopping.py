"""Early stopping of a sweep's running runs, as pure functions of curves ({step: value} of the
rule's metric): the run's own and the other runs'. None means go on; otherwise the reason in
words, which the run's events keep.

Steps of different runs need not line up (logging_steps or eval_steps may differ, or be
swept), so a rule compares at one step s, and another run counts there once it has reported
at or past s, with what it had reported up to s. A run that has not got that far (still
running behind, or ended sooner) is left out: it neither helps nor hurts.

- median (Golovin et al. 2017, "Google Vizier: A Service for Black-Box Optimization"): at its
  latest step s, a run stops when its best value by s is strictly worse than the median of
  the other runs' running averages (each one's mean over its steps up to s).
- halving (asynchronous successive halving, Li et al. 2020, "A System for Massively Parallel
  Hyperparameter Tuning"): rungs at steps min_step * eta**k. At the highest rung it has
  reached, a run goes on only if its value there (its latest at or before the rung's step)
  is among the best 1/eta of the values of every run at that rung, itself included; the best
  one always goes on, and so does a value equal to the cutoff.

Neither rule decides before min_step, nor while fewer than min_runs other runs count.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence

from jobs.sweeps.spec import EarlyStopping

Curve = Mapping[int, float]


def should_stop(
    rule: EarlyStopping, mode: str, curve: Curve, others: Sequence[Curve]
) -> str | None:
    """Whether the run of `curve` should stop, `mode` being the objective's (max or min)."""
    if not curve or max(curve) < rule.min_step:
        return None
    if rule.rule == "median":
        return _median(rule, mode, curve, others)
    return _halving(rule, mode, curve, others)


def _median(rule: EarlyStopping, mode: str, curve: Curve, others: Sequence[Curve]) -> str | None:
    step = max(curve)
    averages = [statistics.fmean(v) for c in others if _reached(c, step) and (v := _until(c, step))]
    if len(averages) < rule.min_runs:
        return None
    best = max(curve.values()) if mode == "max" else min(curve.values())
    median = statistics.median(averages)
    if not _worse(best, median, mode):
        return None
    return (
        f"{rule.metric}: the best {best:.4g} by step {step} is {_side(mode)} the median "
        f"{median:.4g} of {len(averages)} other runs' running averages at that step"
    )


def _halving(rule: EarlyStopping, mode: str, curve: Curve, others: Sequence[Curve]) -> str | None:
    rung, rung_step = 0, rule.min_step
    while rung_step * rule.eta <= max(curve):
        rung, rung_step = rung + 1, rung_step * rule.eta
    own = _until(curve, rung_step)
    peers = [v[-1] for c in others if _reached(c, rung_step) and (v := _until(c, rung_step))]
    if not own or len(peers) < rule.min_runs:
        return None
    value = own[-1]
    ranked = sorted([*peers, value], reverse=mode == "max")
    cutoff = ranked[max(1, len(ranked) // rule.eta) - 1]
    if not _worse(value, cutoff, mode):
        return None
    return (
        f"{rule.metric}: {value:.4g} at step {rung_step} (rung {rung}) is {_side(mode)} "
        f"{cutoff:.4g}, the cutoff of the best 1/{rule.eta} of {len(ranked)} runs at that step"
    )


def _reached(curve: Curve, step: int) -> bool:
    return bool(curve) and max(curve) >= step


def _until(curve: Curve, step: int) -> list[float]:
    """The curve's values at steps up to `step`, in step order."""
    return [curve[s] for s in sorted(curve) if s <= step]


def _worse(value: float, than: float, mode: str) -> bool:
    return value < than if mode == "max" else value > than


def _side(mode: str) -> str:
    return "below" if mode == "max" else "above"
