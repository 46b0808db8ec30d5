"""A run's objective from its curve of the objective metric ({step: value}), and runs ranked
by it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from jobs.sweeps.samplers import Trial
from jobs.sweeps.spec import Objective


def objective_value(objective: Objective, curve: Mapping[int, float]) -> float | None:
    """The value at the latest step (summary last) or the best of all (summary best, by the
    objective's mode); None when the run reported nothing."""
    if not curve:
        return None
    if objective.summary == "last":
        return curve[max(curve)]
    return max(curve.values()) if objective.mode == "max" else min(curve.values())


def rank(trials: Sequence[Trial], mode: str) -> list[Trial]:
    """Best first by mode; trials without a value last; ties by trial number."""

    def key(trial: Trial) -> tuple[bool, float, int]:
        if trial.value is None:
            return (True, 0.0, trial.number)
        return (False, -trial.value if mode == "max" else trial.value, trial.number)

    return sorted(trials, key=key)
