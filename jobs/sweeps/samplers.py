"""The next run of a sweep from its past trials alone: ask and tell as pure functions. The
scheduler may restart at any time, so nothing is kept between calls; the sweep's runs in the
database are the history, and the same history gives the same suggestion.

- grid: the first point, in grid order within the budget, that no trial has taken (a
  deleted run's point comes back).
- random: each parameter drawn by a generator seeded by (spec.seed, trial number), so a
  trial's draw depends on nothing else: not on timing, nor on how other trials did. Ranges
  are uniform, log-uniform with `log`, integers for integer options; values are equally likely.
- tpe: Optuna's TPESampler on an in-memory study rebuilt from the trials at every call
  (`optuna.trial.create_trial`), asked once. Complete trials count with their value, pruned
  ones (stopped early) with theirs as their only intermediate value, failed ones and complete
  ones that reported nothing as failed. Running trials go in as running: TPE's constant liar
  takes them as the worst value, so parallel runs are not suggested next to each other. The
  first trials are random (a third of the budget, at most Optuna's default of 10).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import islice
from typing import TYPE_CHECKING, Any

import numpy as np

from jobs.sweeps.spec import Parameter, SweepSpec, grid_points

if TYPE_CHECKING:
    from types import ModuleType

TRIAL_STATES = ("running", "complete", "pruned", "failed")
_OPTUNA_STATES = dict(zip(TRIAL_STATES, ("RUNNING", "COMPLETE", "PRUNED", "FAIL"), strict=True))
TPE_MAX_STARTUP = 10  # Optuna's default n_startup_trials


@dataclass(frozen=True)
class Trial:
    """One run of a sweep as a sampler sees it. `value` is the objective (objective.py),
    None while running or when the run reported none; `state` is one of TRIAL_STATES."""

    number: int
    params: dict[str, Any]
    value: float | None
    state: str


def next_number(trials: Sequence[Trial]) -> int:
    """The number of the trial `suggest` suggests: one past the highest, so a deleted run's
    number is not given again."""
    return max((t.number for t in trials), default=-1) + 1


def suggest(spec: SweepSpec, trials: Sequence[Trial]) -> dict[str, Any] | None:
    """The parameters of trial `next_number(trials)`, or None once the budget (or the grid)
    is spent; every trial, whatever its state, counts against the budget."""
    if len(trials) >= spec.budget:
        return None
    return _SAMPLERS[spec.method](spec, sorted(trials, key=lambda t: t.number))


def _swept(spec: SweepSpec, params: Mapping[str, Any]) -> dict[str, Any]:
    return {p.name: params.get(p.name) for p in spec.parameters}


def _grid(spec: SweepSpec, trials: Sequence[Trial]) -> dict[str, Any] | None:
    taken = [_swept(spec, t.params) for t in trials]
    points = islice(grid_points(spec.parameters), spec.budget)
    return next((point for point in points if point not in taken), None)


def _seed(spec: SweepSpec, trials: Sequence[Trial]) -> np.random.SeedSequence:
    return np.random.SeedSequence([spec.seed, next_number(trials)])


def _random(spec: SweepSpec, trials: Sequence[Trial]) -> dict[str, Any]:
    rng = np.random.default_rng(_seed(spec, trials))
    return {p.name: _draw(p, rng) for p in spec.parameters}


def _draw(parameter: Parameter, rng: np.random.Generator) -> Any:
    p = parameter
    if p.values is not None:
        return p.values[int(rng.integers(len(p.values)))]
    if p.integer and not p.log:
        return int(rng.integers(p.low, p.high + 1))
    if p.integer:  # log-uniform over [low - 0.5, high + 0.5], rounded, as Optuna draws
        drawn = round(math.exp(rng.uniform(math.log(p.low - 0.5), math.log(p.high + 0.5))))
    elif p.log:
        drawn = math.exp(rng.uniform(math.log(p.low), math.log(p.high)))
    else:
        drawn = float(rng.uniform(p.low, p.high))
    return min(p.high, max(p.low, drawn))  # exp(log(high)) may round past high


def _tpe(spec: SweepSpec, trials: Sequence[Trial]) -> dict[str, Any]:
    import optuna  # a second to import, which only tpe sweeps pay

    distributions = {p.name: _distribution(optuna, p) for p in spec.parameters}
    with _quiet(optuna):
        sampler = optuna.samplers.TPESampler(
            seed=int(_seed(spec, trials).generate_state(1)[0]),
            n_startup_trials=min(TPE_MAX_STARTUP, max(1, spec.budget // 3)),
            multivariate=True,  # Optuna 5's default; experimental in 4
            constant_liar=True,  # Optuna 5's default; experimental in 4
        )
        direction = "maximize" if spec.objective.mode == "max" else "minimize"
        study = optuna.create_study(direction=direction, sampler=sampler)
        study.add_trials(_frozen(optuna, spec, t, distributions) for t in trials)
        return dict(study.ask(distributions).params)


def _distribution(optuna: ModuleType, p: Parameter) -> Any:
    if p.values is not None:
        return optuna.distributions.CategoricalDistribution(p.values)
    if p.integer:
        return optuna.distributions.IntDistribution(p.low, p.high, log=p.log)
    return optuna.distributions.FloatDistribution(p.low, p.high, log=p.log)


def _frozen(optuna: ModuleType, spec: SweepSpec, trial: Trial, distributions: dict) -> Any:
    state = "failed" if trial.state == "complete" and trial.value is None else trial.state
    pruned_value = trial.value if state == "pruned" and trial.value is not None else None
    return optuna.trial.create_trial(
        state=getattr(optuna.trial.TrialState, _OPTUNA_STATES[state]),
        value=trial.value if state == "complete" else None,
        params=_swept(spec, trial.params),
        distributions=distributions,
        intermediate_values=None if pruned_value is None else {0: pruned_value},
    )


@contextmanager
def _quiet(optuna: ModuleType) -> Iterator[None]:
    """Optuna logs every study it creates and warns of its experimental options: noise in the
    scheduler's log at every tick, so both are silenced here, and only here."""
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            yield
    finally:
        optuna.logging.set_verbosity(verbosity)


_SAMPLERS: dict[str, Callable[[SweepSpec, Sequence[Trial]], dict[str, Any] | None]] = {
    "grid": _grid,
    "random": _random,
    "tpe": _tpe,
}
