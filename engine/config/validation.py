"""From what a user wrote (flat, nested or dotted keys; text or typed values) to a RunConfig,
or to every problem at once: per-option checks first, then the cross-option rules."""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping
from typing import Any

from engine.config.coercion import Invalid, check_scalar, check_type, check_value, coerce
from engine.config.errors import FieldError, show
from engine.config.fields import METHODS
from engine.config.rules import RULES
from engine.config.schema import GROUPS, SPECS, RunConfig


def flatten(mapping: Mapping[str, Any]) -> tuple[dict[str, Any], list[FieldError]]:
    """Flat {option: value} from flat, nested ({group: {...}}) or dotted (group.option) keys,
    and the keys that name no option (left out of the result)."""
    flat: dict[str, Any] = {}
    errors: list[FieldError] = []

    def put(group: str | None, name: str, value: Any) -> None:
        spec = SPECS.get(name)
        if spec is None:
            errors.append(_unknown(f"{group}.{name}" if group else name))
        elif group is not None and spec.group != group:
            errors.append(
                FieldError(
                    name,
                    f"{group}.{name} is not an option of group "
                    f"{group!r}: write {spec.path} or just {name}",
                )
            )
        elif name in flat:
            errors.append(FieldError(name, f"{spec.path} is given twice: keep one"))
        else:
            flat[name] = value

    for raw_key, value in mapping.items():
        key = str(raw_key)
        # `model` is both a group and an option: a mapping value means the group.
        if key in GROUPS and isinstance(value, Mapping):
            for name, sub_value in value.items():
                put(key, str(name), sub_value)
        elif key not in SPECS and "." in key and key.split(".", 1)[0] in GROUPS:
            group, name = key.split(".", 1)
            put(group, name, value)
        elif key in GROUPS and key not in SPECS:
            errors.append(
                FieldError(
                    key, f"{key!r} is a group: give it a mapping of its options, got {show(value)}"
                )
            )
        else:
            put(None, key, value)
    return flat, errors


def scalar_errors(flat: Mapping[str, Any]) -> list[FieldError]:
    """The options of flat values given a list, a mapping or another non-scalar. Validation
    refuses them too; the form checks this on import, as its widgets would otherwise hold
    the container's text."""
    errors = []
    for name, value in flat.items():
        try:
            check_scalar(SPECS[name], value)
        except Invalid as exc:
            errors.append(FieldError(name, f"{SPECS[name].path} {exc}"))
    return errors


def problems(given: dict[str, Any], coerce_text: bool) -> list[FieldError]:
    """Every problem of flat `given` (options not given take their defaults).

    Converts `given` in place to typed values (when `coerce_text`) and fills in defaults, so a
    problem-free `given` is ready for `build`.
    """
    errors: list[FieldError] = []
    bad: set[str] = set()
    check = coerce if coerce_text else check_type
    method = given.get("method", "es")
    for spec in SPECS.values():
        if spec.name not in given or (given[spec.name] is None and spec.required):
            if spec.required:
                errors.append(FieldError(spec.name, f"{spec.path} is required: {spec.help}"))
                bad.add(spec.name)
            given[spec.name] = spec.default_for(method if method in METHODS else "es")
            continue
        try:
            value = check(spec, given[spec.name])
            check_value(spec, value)
            given[spec.name] = value
        except Invalid as exc:
            errors.append(FieldError(spec.name, f"{spec.path} {exc}"))
            bad.add(spec.name)
    for rule in RULES:
        if not bad.intersection(rule.fields):
            errors += rule.check(given)
    return errors


def build(values: dict[str, Any]) -> RunConfig:
    """A RunConfig from complete, typed flat values."""
    groups = {
        group: cls(**{f.name: values[f.name] for f in dataclasses.fields(cls)})
        for group, cls in GROUPS.items()
    }
    return RunConfig(method=values["method"], **groups)


def _unknown(key: str) -> FieldError:
    names = [*SPECS, *GROUPS]
    close = difflib.get_close_matches(key, names, n=1, cutoff=0.6)
    hint = f"did you mean {close[0]!r}?" if close else "see `eslab train --help` for options"
    return FieldError(key, f"unknown option {key!r}: {hint}")
