"""How a configuration reports what is wrong with it: every problem at once, each naming its
option, so the CLI prints them all and the form shows each under its field."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class FieldError:
    """One problem: `field` is the flat option name (or 'config' for the file itself)."""

    field: str
    message: str

    def __str__(self) -> str:
        return self.message


class ConfigError(Exception):
    """An invalid configuration; `.errors` lists every problem found, not just the first."""

    def __init__(self, errors: list[FieldError], source: str | None = None) -> None:
        self.errors = list(errors)
        self.source = source
        where = f" in {source}" if source else ""
        count = f"{len(self.errors)} problem" + ("s" if len(self.errors) != 1 else "")
        lines = "\n".join(f"  - {e.message}" for e in self.errors)
        super().__init__(f"invalid configuration{where} ({count}):\n{lines}")


def show(value: Any) -> str:
    """A value as messages quote it: strings in quotes, so `'no'` and `no` stay apart."""
    return repr(value) if isinstance(value, str) else str(value)
