"""The sweep definition as plain frozen data: what is searched (parameters over options of the
run configuration), how (grid, random, tpe), for what (the objective), how many runs (budget,
parallel) and when a run is stopped early.

It round-trips through JSON and YAML (`to_dict`, `from_dict`, `to_yaml`) in the format of a
space file, so the database keeps it and a restarted scheduler rebuilds it. `parse_space` is
the gate for what people write: parsing.py reads the mapping against the schema, configs.py
checks it against the base configuration, both before any run is queued.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import yaml

if TYPE_CHECKING:
    from engine.config import RunConfig

METHODS = ("grid", "random", "tpe")
MODES = ("max", "min")
SUMMARIES = ("last", "best")
RULES = ("median", "halving")
MAX_BUDGET = 1000
"""The most runs a sweep may have, and the most values a grid parameter may take: every grid
point is built and checked before the sweep is queued, and a larger number is a typo."""


class SweepSpecError(Exception):
    """A sweep definition that cannot run; `field` is the path of what is wrong
    ("parameters.noise_std.low", "objective.metric", "budget"), the message names it too."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


@dataclass(frozen=True)
class Parameter:
    """One swept option: a finite choice (`values`) or a numeric range (`low`..`high`, both
    included; `log` draws on a log scale). `integer` follows the option's type."""

    name: str
    values: tuple[Any, ...] | None = None
    low: float | int | None = None
    high: float | int | None = None
    log: bool = False
    integer: bool = False

    def grid_values(self) -> Sequence[Any]:
        """What a grid takes: the values, or every integer of an integer range (lazily: its
        size is checked before anything iterates it)."""
        if self.values is not None:
            return self.values
        if not self.integer:
            raise ValueError(f"parameter {self.name} is a continuous range: a grid needs values")
        return range(int(self.low), int(self.high) + 1)

    def to_dict(self) -> dict[str, Any]:
        if self.values is not None:
            return {"values": list(self.values)}
        return {"low": self.low, "high": self.high, "log": self.log}


@dataclass(frozen=True)
class Objective:
    """What ranks the runs: a metric key, whether higher or lower is better, and which of the
    run's values counts (its last, or its best)."""

    metric: str
    mode: str = "max"
    summary: str = "last"


@dataclass(frozen=True)
class EarlyStopping:
    """When a running run is stopped for doing worse than the others (stopping.py): no
    decision before `min_step`, nor while fewer than `min_runs` other runs can be compared.
    `eta` is the reduction factor of rule halving (its rungs are min_step * eta**k)."""

    rule: str
    metric: str
    min_step: int = 1
    min_runs: int = 3
    eta: int = 3

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        if self.rule != "halving":
            del data["eta"]  # only halving reads it, and the parser refuses it elsewhere
        return data


@dataclass(frozen=True)
class SweepSpec:
    """A whole sweep but its base configuration (which the database keeps beside it)."""

    method: str
    parameters: tuple[Parameter, ...]
    objective: Objective
    budget: int
    parallel: int = 2
    seed: int = 0
    early_stopping: EarlyStopping | None = None

    def to_dict(self) -> dict[str, Any]:
        """The space file's mapping, every default written out; JSON and YAML safe."""
        data: dict[str, Any] = {
            "method": self.method,
            "budget": self.budget,
            "parallel": self.parallel,
            "seed": self.seed,
            "objective": asdict(self.objective),
        }
        if self.early_stopping is not None:
            data["early_stopping"] = self.early_stopping.to_dict()
        data["parameters"] = {p.name: p.to_dict() for p in self.parameters}
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SweepSpec:
        """Read back `to_dict`'s mapping (checked against the schema again, not against a
        base configuration: that was done before it was stored)."""
        from jobs.sweeps.parsing import parse

        return parse(data)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)


def grid_points(parameters: Sequence[Parameter]) -> Iterator[dict[str, Any]]:
    """Every combination, in a fixed order: itertools.product over the parameters in their
    given order (the last one changes fastest)."""
    names = [p.name for p in parameters]
    for combination in itertools.product(*(p.grid_values() for p in parameters)):
        yield dict(zip(names, combination, strict=True))


def grid_size(parameters: Sequence[Parameter]) -> int:
    return math.prod(len(p.grid_values()) for p in parameters)


def parse_space(mapping: Mapping[str, Any], base: RunConfig) -> SweepSpec:
    """A space file's mapping as a SweepSpec, or SweepSpecError naming the first problem: the
    mapping against the schema, then base + every grid point (random and tpe: every
    combination of the parameters' bounds and values) as a valid run configuration."""
    from jobs.sweeps.configs import check_against
    from jobs.sweeps.parsing import parse

    spec = parse(mapping)
    check_against(spec, base)
    return spec


def grid_option(text: str, base: RunConfig) -> Parameter:
    """The CLI's `--grid option=a,b,c` as a Parameter of those values (each checked on base);
    `Parameter.to_dict()` puts it into a space mapping. A text value holding a comma needs a
    space file."""
    from jobs.sweeps.configs import check_points
    from jobs.sweeps.options import parse_parameter

    name, sep, values = text.partition("=")
    if not sep or not name.strip() or not values.strip():
        raise SweepSpecError(
            "grid", f"--grid {text!r} must look like option=a,b,c, e.g. noise_std=0.001,0.002"
        )
    parameter = parse_parameter(name.strip(), {"values": [v.strip() for v in values.split(",")]})
    check_points(base, ({parameter.name: v} for v in parameter.values))
    return parameter
