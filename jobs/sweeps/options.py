"""One swept option: which options of the run configuration may be swept, and a parameter's
values or range read against the option's own spec, so a value is refused with the schema's
own words (engine/config/coercion.py).

Options that may not be swept, and why:
- `method`: the method decides which options apply and the defaults of others (n and
  temperature are 8 and 1.0 under lbes), so runs of two methods would differ in more than
  the swept option; make one sweep per method.
- `run_name` and `output_dir`: they identify a run and its files; every run of a sweep gets
  its own.
- `eval_file` and `eval_sets`: the evaluation sets are what eval metrics, and so the
  objective, measure; runs scored on different sets cannot be ranked against each other.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

from engine.config import FieldSpec, config_fields
from engine.config.coercion import Invalid, check_value, coerce
from engine.config.errors import show
from jobs.sweeps.spec import Parameter, SweepSpecError

OPTIONS: dict[str, FieldSpec] = {spec.name: spec for spec in config_fields()}
NOT_SWEPT: dict[str, str] = {
    "method": "it decides which options apply and the defaults of others: make one sweep "
    "per method",
    "run_name": "every run of a sweep gets its own name",
    "output_dir": "every run of a sweep gets its own output folder",
    "eval_file": "eval metrics measure this set, so runs evaluated on different sets cannot "
    "be ranked against each other",
    "eval_sets": "eval metrics measure these sets, so runs evaluated on different sets cannot "
    "be ranked against each other",
}
PARAMETER_KEYS = ("values", "low", "high", "log")
_FORMS = "give {values: [...]} or {low: ..., high: ...}"


def own_key(
    name: str,
    type_: type,
    *,
    choices: tuple[str, ...] | None = None,
    min_value: float | None = None,
    max_value: float | None = None,
) -> FieldSpec:
    """A spec for a key of the sweep itself (budget, objective.mode, ...), so `typed` checks
    it with the same coercion and words as an option."""
    return FieldSpec(
        name=name,
        group="",
        type=type_,
        default=None,
        label=name,
        help="",
        choices=choices,
        min=min_value,
        max=max_value,
    )


_LOG = own_key("log", bool)


def typed(spec: FieldSpec, value: Any, path: str) -> Any:
    """`value` converted and checked as `spec` would, or SweepSpecError at `path`."""
    try:
        result = coerce(spec, value)
        check_value(spec, result)
    except Invalid as exc:
        raise SweepSpecError(path, f"{path} {exc}") from None
    return result


def option_spec(name: str, path: str) -> FieldSpec:
    """The spec of a sweepable option, or SweepSpecError saying why `name` is none."""
    spec = OPTIONS.get(name)
    if spec is None:
        close = difflib.get_close_matches(name, list(OPTIONS), n=1, cutoff=0.6)
        hint = f": did you mean {close[0]!r}?" if close else ": see `eslab train --help`"
        raise SweepSpecError(path, f"{path}: unknown option {name!r}{hint}")
    if name in NOT_SWEPT:
        raise SweepSpecError(path, f"{path}: {name} cannot be swept: {NOT_SWEPT[name]}")
    return spec


def parse_parameter(name: str, entry: Any) -> Parameter:
    """`name: {values: [...]}` or `name: {low: .., high: .., log: ..}` as a Parameter."""
    path = f"parameters.{name}"
    spec = option_spec(name, path)
    if not isinstance(entry, Mapping):
        raise SweepSpecError(path, f"{path} must be a mapping: {_FORMS}, got {show(entry)}")
    for key in entry:
        if key not in PARAMETER_KEYS:
            raise SweepSpecError(
                f"{path}.{key}",
                f"{path}.{key} is not a parameter key: use values, or low, high and log",
            )
    if "values" in entry:
        if entry.keys() & {"low", "high", "log"}:
            raise SweepSpecError(path, f"{path} gives values and a range: give one of them")
        return Parameter(
            name, values=_values(spec, entry["values"], path), integer=spec.type is int
        )
    return _range(spec, entry, path)


def _values(spec: FieldSpec, values: Any, path: str) -> tuple[Any, ...]:
    if not isinstance(values, list | tuple) or not values:
        raise SweepSpecError(
            f"{path}.values", f"{path}.values must be a non-empty list, got {show(values)}"
        )
    result = tuple(typed(spec, value, f"{path}.values[{i}]") for i, value in enumerate(values))
    for i, value in enumerate(result):
        if value in result[:i]:
            raise SweepSpecError(f"{path}.values", f"{path}.values has {show(value)} twice")
    return result


def _range(spec: FieldSpec, entry: Mapping[str, Any], path: str) -> Parameter:
    if spec.type not in (int, float):
        kind = "true or false" if spec.type is bool else "text"
        raise SweepSpecError(
            path, f"{path}: {spec.name} is {kind}, which has no range: give {{values: [...]}}"
        )
    for key in ("low", "high"):
        if key not in entry:
            raise SweepSpecError(f"{path}.{key}", f"{path}.{key} is required: {_FORMS}")
    low, high = (_bound(spec, entry[key], f"{path}.{key}") for key in ("low", "high"))
    if low >= high:
        raise SweepSpecError(f"{path}.low", f"{path}.low must be < high ({high}), got {low}")
    log = typed(_LOG, entry.get("log", False), f"{path}.log")
    if log and low <= 0:
        raise SweepSpecError(
            f"{path}.low", f"{path}.low must be > 0 with log true (a log scale has no 0), got {low}"
        )
    return Parameter(spec.name, low=low, high=high, log=log, integer=spec.type is int)


def _bound(spec: FieldSpec, value: Any, path: str) -> float | int:
    bound = typed(spec, value, path)
    if bound is None:  # an option that accepts None: no bound of a range
        raise SweepSpecError(path, f"{path} must be a number, got {show(value)}")
    return bound
