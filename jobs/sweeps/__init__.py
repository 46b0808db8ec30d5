"""Sweeps: a base run configuration, a search space over its options, an objective and a
budget. This package is the pure part (no database, Ray or vLLM), each module one job:
`spec` (the definition as data, `parse_space`, `grid_option`), `options` (which options may
be swept, one parameter read against its option), `parsing` (a space mapping read against
the schema), `configs` (base + a trial's parameters as a run configuration, checked before
anything is queued), `samplers` (the next run: grid, random, tpe), `stopping` (median and
halving early stopping) and `objective` (a run's value, runs ranked). docs/sweeps.md
describes the space file and the rules.
"""

from jobs.sweeps.configs import trial_config
from jobs.sweeps.objective import objective_value, rank
from jobs.sweeps.samplers import Trial, next_number, suggest
from jobs.sweeps.spec import (
    EarlyStopping,
    Objective,
    Parameter,
    SweepSpec,
    SweepSpecError,
    grid_option,
    parse_space,
)
from jobs.sweeps.stopping import should_stop

__all__ = [
    "EarlyStopping",
    "Objective",
    "Parameter",
    "SweepSpec",
    "SweepSpecError",
    "Trial",
    "grid_option",
    "next_number",
    "objective_value",
    "parse_space",
    "rank",
    "should_stop",
    "suggest",
    "trial_config",
]
