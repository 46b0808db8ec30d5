"""A space mapping (a space file, the CLI's options, a stored sweep) read into a SweepSpec:
every key checked with the schema's coercion, every problem a SweepSpecError naming its path.
Whether the runs it makes are valid configurations is configs.py's check."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import fields
from typing import Any

from engine import metrics
from engine.config.errors import show
from jobs.sweeps.options import own_key, parse_parameter, typed
from jobs.sweeps.spec import (
    MAX_BUDGET,
    METHODS,
    MODES,
    RULES,
    SUMMARIES,
    EarlyStopping,
    Objective,
    Parameter,
    SweepSpec,
    SweepSpecError,
    grid_size,
)

TOP_KEYS = ("method", "budget", "parallel", "seed", "objective", "early_stopping", "parameters")
OBJECTIVE_KEYS = ("metric", "mode", "summary")
STOPPING_KEYS = ("rule", "metric", "min_step", "min_runs", "eta")
DEFAULT_METHOD = "grid"

_METHOD = own_key("method", str, choices=METHODS)
_BUDGET = own_key("budget", int, min_value=1, max_value=MAX_BUDGET)
_PARALLEL = own_key("parallel", int, min_value=1)
_SEED = own_key("seed", int, min_value=0)
_MODE = own_key("mode", str, choices=MODES)
_SUMMARY = own_key("summary", str, choices=SUMMARIES)
_RULE = own_key("rule", str, choices=RULES)
_MIN_STEP = own_key("min_step", int, min_value=1)  # halving's rungs are min_step * eta**k
_MIN_RUNS = own_key("min_runs", int, min_value=1)
_ETA = own_key("eta", int, min_value=2)


def parse(mapping: Any) -> SweepSpec:
    if not isinstance(mapping, Mapping):
        raise SweepSpecError(
            "space",
            f"a sweep space must be a mapping of {', '.join(TOP_KEYS)}, got {show(mapping)}",
        )
    _known_keys(mapping, TOP_KEYS, "")
    method = typed(_METHOD, mapping.get("method", DEFAULT_METHOD), "method")
    parameters = _parameters(mapping.get("parameters"), method)
    objective = _objective(mapping.get("objective"))
    return SweepSpec(
        method=method,
        parameters=parameters,
        objective=objective,
        budget=_budget(mapping.get("budget"), method, parameters),
        parallel=typed(
            _PARALLEL, mapping.get("parallel", _default(SweepSpec, "parallel")), "parallel"
        ),
        seed=typed(_SEED, mapping.get("seed", _default(SweepSpec, "seed")), "seed"),
        early_stopping=_early_stopping(mapping.get("early_stopping"), objective.metric),
    )


def _default(cls: type, name: str) -> Any:
    """A dataclass field's default: the dataclasses of spec.py hold them once."""
    return next(f.default for f in fields(cls) if f.name == name)


def _known_keys(mapping: Mapping[str, Any], keys: tuple[str, ...], prefix: str) -> None:
    for key in mapping:
        if key not in keys:
            close = difflib.get_close_matches(str(key), keys, n=1, cutoff=0.6)
            hint = f"did you mean {close[0]!r}?" if close else f"the keys are {', '.join(keys)}"
            where = prefix.rstrip(".") or "a sweep"
            raise SweepSpecError(f"{prefix}{key}", f"{prefix}{key} is not a key of {where}: {hint}")


def _parameters(entry: Any, method: str) -> tuple[Parameter, ...]:
    if not isinstance(entry, Mapping) or not entry:
        raise SweepSpecError(
            "parameters",
            "parameters must map at least one option to {values: [...]} or {low: ..., high: ...}, "
            f"got {show(entry)}",
        )
    parameters = tuple(parse_parameter(str(name), value) for name, value in entry.items())
    if method == "grid":
        for parameter in parameters:
            _check_grid_parameter(parameter)
    return parameters


def _check_grid_parameter(parameter: Parameter) -> None:
    path = f"parameters.{parameter.name}"
    if parameter.values is None and not parameter.integer:
        raise SweepSpecError(
            path,
            f"{path}: a grid needs values, and this is a range of real numbers: give values, "
            "or use method random or tpe",
        )
    if parameter.log:
        raise SweepSpecError(
            f"{path}.log",
            f"{path}.log only shapes how random and tpe draw: a grid takes every integer of the "
            "range",
        )
    if (count := len(parameter.grid_values())) > MAX_BUDGET:
        raise SweepSpecError(
            path,
            f"{path} gives a grid of {count} values, more than the {MAX_BUDGET} a sweep may run",
        )


def _budget(value: Any, method: str, parameters: tuple[Parameter, ...]) -> int:
    if method != "grid":
        if value is None:
            raise SweepSpecError(
                "budget", f"budget is required with method {method}: how many runs"
            )
        return typed(_BUDGET, value, "budget")
    size = grid_size(parameters)
    if value is None:
        if size > MAX_BUDGET:
            raise SweepSpecError(
                "budget",
                f"budget is required for a grid of more than {MAX_BUDGET} points (this one has "
                f"{size}): give a budget to run its first ones, or fewer values",
            )
        return size
    budget = typed(_BUDGET, value, "budget")
    if budget > size:
        raise SweepSpecError("budget", f"budget must be <= the grid's {size} points, got {budget}")
    return budget


def _objective(entry: Any) -> Objective:
    """A mapping, or the CLI's text `METRIC[:max|min]`."""
    if isinstance(entry, str):
        metric, sep, mode = entry.partition(":")
        entry = {"metric": metric.strip(), "mode": mode.strip()} if sep else {"metric": metric}
    if not isinstance(entry, Mapping):
        raise SweepSpecError(
            "objective",
            f"objective must be e.g. {{metric: eval/reward/mean, mode: max}}, got {show(entry)}",
        )
    _known_keys(entry, OBJECTIVE_KEYS, "objective.")
    return Objective(
        metric=_metric(entry.get("metric"), "objective.metric"),
        mode=typed(_MODE, entry.get("mode", _default(Objective, "mode")), "objective.mode"),
        summary=typed(
            _SUMMARY, entry.get("summary", _default(Objective, "summary")), "objective.summary"
        ),
    )


def _metric(value: Any, path: str) -> str:
    if not isinstance(value, str) or not value:
        raise SweepSpecError(
            path, f"{path} must be a metric key such as eval/reward/mean, got {show(value)}"
        )
    if not metrics.is_known_key(value):
        close = metrics.close_key(value)
        hint = f"did you mean {close!r}?" if close else "docs/metrics.md lists the keys"
        raise SweepSpecError(path, f"{path} {value[:100]!r} is not a metric key: {hint}")
    return value


def _early_stopping(entry: Any, objective_metric: str) -> EarlyStopping | None:
    if entry is None:
        return None
    if not isinstance(entry, Mapping) or "rule" not in entry:
        raise SweepSpecError(
            "early_stopping",
            "early_stopping must be a mapping with a rule (median or halving), got " + show(entry),
        )
    _known_keys(entry, STOPPING_KEYS, "early_stopping.")
    rule = typed(_RULE, entry["rule"], "early_stopping.rule")
    if rule != "halving" and "eta" in entry:
        raise SweepSpecError(
            "early_stopping.eta", f"early_stopping.eta only applies to rule halving, not {rule}"
        )

    def number(spec: Any, key: str) -> int:
        return typed(spec, entry.get(key, _default(EarlyStopping, key)), f"early_stopping.{key}")

    return EarlyStopping(
        rule=rule,
        metric=_metric(entry.get("metric", objective_metric), "early_stopping.metric"),
        min_step=number(_MIN_STEP, "min_step"),
        min_runs=number(_MIN_RUNS, "min_runs"),
        eta=number(_ETA, "eta"),
    )
