"""A sweep's runs as run configurations: base + a trial's parameters, and the check that the
runs a sweep will make are valid before any is queued (the cross-option rules of
engine/config/rules.py, and an objective the runs report).

Grid: every point within the budget is built. Random and tpe draw from ranges, so their runs
cannot all be known in advance: every combination of the parameters' bounds and values is
built (the first MAX_BUDGET in grid order). A rule that a value inside a range breaks (an odd
population_size with antithetic) is found when that run is queued: `trial_config` raises the
same ConfigError then.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from typing import Any

from engine.config import ConfigError, RunConfig
from engine.config.errors import show
from jobs.sweeps.spec import MAX_BUDGET, SweepSpec, SweepSpecError, grid_points


def trial_config(base: RunConfig, params: Mapping[str, Any]) -> RunConfig:
    """What a trial runs: base with its parameters set (ConfigError when they break a rule)."""
    return RunConfig.from_flat({**base.to_flat(), **params})


def check_against(spec: SweepSpec, base: RunConfig) -> None:
    """SweepSpecError at the first run of `spec` on `base` that would be refused or would not
    report the objective (or early stopping's metric)."""
    metrics = {"objective.metric": spec.objective.metric}
    if spec.early_stopping is not None:
        metrics["early_stopping.metric"] = spec.early_stopping.metric
    for point, config in check_points(base, _points(spec)):
        for path, metric in metrics.items():
            if metric.startswith("eval/") and config.eval.eval_strategy == "no":
                raise _unreported(path, metric, point)


def _unreported(path: str, metric: str, point: Mapping[str, Any]) -> SweepSpecError:
    if "eval_strategy" in point:
        where = f"the run at {_shown(point)}"
        fix = "leave 'no' out of parameters.eval_strategy"
    else:
        where = "the base configuration"
        fix = "set eval_strategy (and eval_file) in the base configuration"
    return SweepSpecError(
        path,
        f"{path} {metric!r} is reported only by runs that evaluate, but eval_strategy is 'no' "
        f"in {where}: {fix}, or use a train/ metric",
    )


def check_points(
    base: RunConfig, points: Iterable[dict[str, Any]]
) -> list[tuple[dict[str, Any], RunConfig]]:
    """Each point with its run configuration, or SweepSpecError at the first that breaks a
    rule, naming the point's values and every problem."""
    checked = []
    for point in points:
        try:
            checked.append((point, trial_config(base, point)))
        except ConfigError as exc:
            blamed = next((e.field for e in exc.errors if e.field in point), None)
            field = f"parameters.{blamed}" if blamed else "parameters"
            problems = "; ".join(e.message for e in exc.errors)
            raise SweepSpecError(
                field, f"{field}: the run at {_shown(point)} would be refused: {problems}"
            ) from None
    return checked


def _points(spec: SweepSpec) -> Iterable[dict[str, Any]]:
    if spec.method == "grid":
        return itertools.islice(grid_points(spec.parameters), spec.budget)
    names = [p.name for p in spec.parameters]
    edges = (p.values if p.values is not None else (p.low, p.high) for p in spec.parameters)
    combinations = itertools.islice(itertools.product(*edges), MAX_BUDGET)
    return (dict(zip(names, c, strict=True)) for c in combinations)


def _shown(point: Mapping[str, Any]) -> str:
    return ", ".join(f"{name}={show(value)}" for name, value in point.items())
