"""Optional dependencies: the parts of ES Lab that need an extra say which one.

The default install stays lean; the scorer service (`eslab[scorer]`), the HTML report's
renderer (`eslab[report]`), the PostgreSQL driver (`eslab[postgres]`) and the trackers of
report_to (`eslab[tensorboard]`, `eslab[wandb]`) come as extras (`eslab[all]` has them all but
wandb, and `make run` / `make test` install it). Code that needs one
imports it through `require`, so a missing extra is one line naming the command that fixes
it, never a bare ModuleNotFoundError from deep inside a request.
"""

from __future__ import annotations

import importlib
from types import ModuleType


class MissingExtra(ImportError):
    """A module of an optional extra is not installed."""


def require(module: str, extra: str, what: str) -> ModuleType:
    """`module`, imported, or MissingExtra naming the extra that brings it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtra(
            f"{what} needs the `{extra}` extra: pip install 'eslab[{extra}]' "
            f"({module} is not installed)"
        ) from exc
