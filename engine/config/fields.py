"""Options as data: `option()` declares a dataclass field with everything a validator, the CLI
and the form need, and `field_specs()` reads those declarations back as `FieldSpec`s, so the
schema's dataclasses stay the one place an option is described."""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, get_type_hints

METHODS = ("es", "lbes")


def option(
    default: Any,
    help: str,
    *,
    label: str,
    choices: tuple[str, ...] | None = None,
    min_value: float | None = None,
    max_value: float | None = None,
    exclusive_min: bool = False,
    required: bool = False,
    method_defaults: Mapping[str, Any] | None = None,
    methods: tuple[str, ...] = METHODS,
    words: tuple[str, ...] = (),
) -> Any:
    """A dataclass field carrying what validation, the CLI and the form need to know: `label`
    is the option in people's words (the form shows it beside the option's name), `help` says
    what it does. `words` are values a number option also takes as they are (`auto`: ES Lab
    chooses the number where the run starts); validation, the CLI, YAML and the form accept
    them in place of a number."""
    metadata = {
        "label": label,
        "help": help,
        "choices": choices,
        "min": min_value,
        "max": max_value,
        "exclusive_min": exclusive_min,
        "required": required,
        "method_defaults": dict(method_defaults or {}),
        "methods": methods,
        "words": words,
    }
    return field(default=default, metadata=metadata)


@dataclass(frozen=True)
class FieldSpec:
    """Everything about one option that a CLI, a form or a validator needs."""

    name: str
    group: str  # "" for the root-level `method`
    type: type  # str, int, float or bool
    default: Any
    label: str  # the option in people's words, e.g. "Noise std (sigma)"
    help: str
    choices: tuple[str, ...] | None = None
    min: float | None = None
    max: float | None = None
    exclusive_min: bool = False  # min itself is not allowed (e.g. noise_std > 0)
    required: bool = False
    nullable: bool = False  # None is an accepted value
    method_defaults: Mapping[str, Any] = field(default_factory=dict)
    methods: tuple[str, ...] = METHODS  # the methods that read this option
    words: tuple[str, ...] = ()  # values taken as they are in place of a number, e.g. auto

    @property
    def path(self) -> str:
        """Qualified name used in messages, e.g. es.noise_std."""
        return f"{self.group}.{self.name}" if self.group else self.name

    def default_for(self, method: str) -> Any:
        return self.method_defaults.get(method, self.default)


def group_title(cls: type) -> str:
    """A group's heading in people's words: its class's TITLE (the form's section, YAML's
    comment); a group without one is a schema bug, so it fails at import."""
    title = cls.__dict__.get("TITLE")
    if not isinstance(title, str) or not title:
        raise TypeError(f"option group {cls.__name__} has no TITLE")
    return title


def option_groups(root: type) -> dict[str, type]:
    """Group name -> dataclass: every field of `root` that is itself a dataclass, in order."""
    return {
        name: hint for name, hint in get_type_hints(root).items() if dataclasses.is_dataclass(hint)
    }


def field_specs(root: type) -> dict[str, FieldSpec]:
    """Every option of `root`: its own (group "") first, then group by group.

    Flat YAML needs option names unique across groups; a clash is a schema bug, so it fails
    at import rather than in a user's run.
    """
    groups = option_groups(root)
    root_hints = get_type_hints(root)
    specs = {
        f.name: _spec(f, root_hints[f.name], "")
        for f in dataclasses.fields(root)
        if f.name not in groups
    }
    for group, cls in groups.items():
        hints = get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if f.name in specs:
                raise TypeError(f"option name {f.name!r} of group {group!r} is not unique")
            specs[f.name] = _spec(f, hints[f.name], group)
    return specs


def _base_type(hint: Any) -> tuple[type, bool]:
    """(base type, accepts None) of an annotation such as `int | None`; the first type of a
    union is the base (`int | str` is a number that also takes words such as auto)."""
    if isinstance(hint, types.UnionType):
        args = [a for a in hint.__args__ if a is not type(None)]
        return args[0], len(args) < len(hint.__args__)
    return hint, False


def _spec(f: dataclasses.Field, hint: Any, group: str) -> FieldSpec:
    base, optional = _base_type(hint)
    m = f.metadata
    return FieldSpec(
        name=f.name,
        group=group,
        type=base,
        default=f.default,
        label=m["label"],
        help=m["help"],
        choices=m["choices"],
        min=m["min"],
        max=m["max"],
        exclusive_min=m["exclusive_min"],
        required=m["required"],
        nullable=optional and not m["required"],
        method_defaults=m["method_defaults"],
        methods=m["methods"],
        words=m["words"],
    )
