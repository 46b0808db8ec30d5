"""One option's value against its spec: text (CLI `--set`, form widgets, YAML) converted to
the option's type, then its choices and range checked."""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping
from typing import Any

from engine.config.errors import show
from engine.config.fields import FieldSpec

# Strings read as None for options that accept None (CLI `--set eval_file=none`, empty form).
_NONE_WORDS = {"none", "null", "~", ""}
_TRUE_WORDS = {"true", "yes", "on", "1"}
_FALSE_WORDS = {"false", "no", "off", "0"}
_KINDS = {bool: "true or false", int: "an integer", float: "a number", str: "text"}
MAX_INT = 2**63 - 1
"""The largest integer option a database column and the engine's seeds can hold."""


class Invalid(Exception):
    """A value breaks its option's rule; the message completes '<es.noise_std> ...'."""


def coerce(spec: FieldSpec, value: Any) -> Any:
    """The value converted to the option's type, strings parsed (CLI, forms, YAML)."""
    check_scalar(spec, value)
    spelled, special = _special(spec, value)
    if spelled:
        return special
    if spec.type is bool:
        if isinstance(value, bool):
            return value
        word = str(value).strip().lower() if isinstance(value, str | int) else None
        if word in _TRUE_WORDS | _FALSE_WORDS:
            return word in _TRUE_WORDS
        raise Invalid(f"must be true or false, got {_shown(value)}")
    if spec.type is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value  # exact: no detour through float
        number = _number(value)
        if number is None or not number.is_integer():
            raise Invalid(f"must be {_kind(spec, 'an integer')}, got {_shown(value)}")
        return int(number)
    if spec.type is float:
        number = _number(value)
        if number is None:
            raise Invalid(f"must be {_kind(spec, 'a finite number')}, got {_shown(value)}")
        return number
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)  # e.g. `run_name: 2024` in YAML
    if not isinstance(value, str):
        raise Invalid(f"must be a string, got {_shown(value)} ({type(value).__name__})")
    return value


def check_type(spec: FieldSpec, value: Any) -> Any:
    """For direct construction: the value must already have the option's type."""
    check_scalar(spec, value)
    if (value is None and spec.nullable) or (isinstance(value, str) and value in spec.words):
        return value
    if spec.type is bool:
        ok = isinstance(value, bool)
    elif spec.type is float:
        ok = _number(value) is not None and not isinstance(value, str)
    else:  # bool is an int subclass, but True is no population size
        ok = isinstance(value, spec.type) and not isinstance(value, bool)
    if not ok:
        kind = _kind(spec, f"of type {spec.type.__name__}")
        raise Invalid(f"must be {kind}, got {_shown(value)} ({type(value).__name__})")
    return value


def check_scalar(spec: FieldSpec, value: Any) -> None:
    """One plain value (text, number, boolean or None), never a list, a mapping or a YAML
    date: every option holds one value, and a container's text would only mislead."""
    if value is None or isinstance(value, str | int | float):
        return
    if isinstance(value, Mapping):
        got = f"a mapping of {len(value)} key(s)"
    elif isinstance(value, list | tuple | set):
        got = f"a list of {len(value)} item(s)"
    else:
        got = f"a {type(value).__name__} ({str(value)[:40]}): quote it to give text"
    raise Invalid(f"must be one value ({_KINDS.get(spec.type, spec.type.__name__)}), got {got}")


def check_value(spec: FieldSpec, value: Any) -> None:
    """Choices and range of an already typed value."""
    if value is None or (isinstance(value, str) and value in spec.words):
        return
    if spec.type is int and abs(value) > MAX_INT:
        digits = len(str(abs(value)))
        raise Invalid(f"must be at most {MAX_INT} (2**63 - 1), got an integer of {digits} digits")
    if spec.choices is not None and value not in spec.choices:
        close = difflib.get_close_matches(str(value), spec.choices, n=1)
        hint = f": did you mean {close[0]!r}?" if close else ""
        raise Invalid(f"must be one of {', '.join(spec.choices)}, got {_shown(value)}{hint}")
    if spec.type is str and spec.choices is None and not value.strip():
        raise Invalid("must not be empty")
    if spec.min is not None and (value <= spec.min if spec.exclusive_min else value < spec.min):
        sign = ">" if spec.exclusive_min else ">="
        raise Invalid(f"must be {sign} {spec.min:g}, got {_shown(value)}")
    if spec.max is not None and value > spec.max:
        raise Invalid(f"must be <= {spec.max:g}, got {_shown(value)}")


def _special(spec: FieldSpec, value: Any) -> tuple[bool, Any]:
    """(True, the value) where `value` spells one of the option's words (spec.words, e.g.
    auto) or, for an option that takes None, None (none, null, ~ or nothing); else
    (False, None)."""
    word = value.strip().lower() if isinstance(value, str) else value
    if isinstance(word, str) and word in spec.words:
        return True, word
    if spec.nullable and (word is None or word in _NONE_WORDS):
        return True, None
    return False, None


def _kind(spec: FieldSpec, kind: str) -> str:
    """What a value must be, its words included: "an integer or auto"."""
    return " or ".join([kind, *spec.words])


def _shown(value: Any) -> str:
    """The value as messages quote it, cut short: a 400-digit number or a long text would bury
    the message."""
    text = show(value)
    return text if len(text) <= 60 else f"{text[:57]}..."


def _number(value: Any) -> float | None:
    """A finite float from a number or a numeric string; None otherwise (bools included)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            return None
    if not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:  # an integer beyond the float range
        return None
    return number if math.isfinite(number) else None
