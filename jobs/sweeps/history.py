"""A sweep's past, read back from the store: each of its runs as a trial (state, parameters,
objective) with the metric curves that early stopping and the objective read.

Nothing of it is kept between passes: the scheduler may restart at any time, so each pass
rebuilds the trials from the runs, their metrics and their events. One query reads a
metric's curves for all the sweep's runs, one the marks of the runs it stopped early."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from engine.config import ConfigError, RunConfig
from jobs.store.records import RunRecord
from jobs.store.status import RunStatus
from jobs.store.store import Store
from jobs.sweeps.configs import trial_config
from jobs.sweeps.objective import objective_value
from jobs.sweeps.samplers import Trial
from jobs.sweeps.spec import SweepSpec

PRUNED = "stopped early by its sweep"
"""How the event that a sweep writes when it stops a run early begins (the reason follows):
the mark by which a cancelled run is told apart as a pruned trial."""


def pruned_event(attempt: int, reason: str) -> str:
    """The mark names the attempt: a pruned run that a person resumes is a trial again (its
    next attempt was not stopped early)."""
    return f"{PRUNED} (attempt {attempt}): {reason}"


@dataclass(frozen=True)
class SweepTrial:
    """One run of a sweep as a trial. `trial.value` is what the samplers learn from: the
    objective of a complete trial, and of what a pruned one reported before it was stopped;
    `so_far` is the objective of whatever the run recorded, for people (a running run's,
    too)."""

    run: RunRecord
    trial: Trial
    so_far: float | None


def stored_forms(spec: SweepSpec, base: RunConfig) -> dict[str, dict[Any, Any]]:
    """{option: {value as a run stores it: value as the sweep gives it}} for the swept values
    that differ once stored: a run stores its paths resolved (a model or dataset named
    `data/...` as an absolute path), but the samplers know the values as the space gives
    them (a grid point is taken once, a tpe choice is one of its choices)."""
    forms: dict[str, dict[Any, Any]] = {}
    for p in spec.parameters:
        for value in p.values or ():
            if not isinstance(value, str):
                continue
            try:
                config = trial_config(base, {p.name: value}).with_resolved_paths()
            except ConfigError:
                continue  # a value that needs another parameter's: stored as given
            stored = config.to_flat()[p.name]
            if stored != value:
                forms.setdefault(p.name, {})[stored] = value
    return forms


def trial_params(
    spec: SweepSpec, run: RunRecord, forms: Mapping[str, Mapping[Any, Any]]
) -> dict[str, Any]:
    """The swept options' values of the run, as the sweep gave them."""
    params = {}
    for p in spec.parameters:
        stored = run.config.get(p.name)
        params[p.name] = forms.get(p.name, {}).get(stored, stored)
    return params


def trial_state(run: RunRecord, pruned: bool) -> str:
    """queued and running: running; succeeded: complete; stopped by its sweep: pruned; failed,
    or cancelled by a person (no result to learn from): failed. A run being stopped counts as
    what it becomes."""
    if run.status in (RunStatus.QUEUED, RunStatus.RUNNING):
        return "running"
    if run.status is RunStatus.SUCCEEDED:
        return "complete"
    if pruned and run.status in (RunStatus.CANCELLING, RunStatus.CANCELLED):
        return "pruned"
    return "failed"


def pruned_runs(store: Store, runs: Sequence[RunRecord]) -> set[int]:
    """The runs whose current attempt the sweep stopped early."""
    stopped = [r for r in runs if r.status in (RunStatus.CANCELLING, RunStatus.CANCELLED)]
    if not stopped:
        return set()
    marks = store.events_starting_with([r.id for r in stopped], PRUNED)
    return {
        r.id for r in stopped if any(m.startswith(pruned_event(r.attempt, "")) for m in marks[r.id])
    }


def read_trials(
    store: Store,
    spec: SweepSpec,
    base: RunConfig,
    runs: Sequence[RunRecord],
    curves: Mapping[int, Mapping],
) -> list[SweepTrial]:
    """The sweep's `runs` as trials; `curves` are the objective metric's, by run id
    (store.metric_curves)."""
    pruned = pruned_runs(store, runs)
    forms = stored_forms(spec, base) if runs else {}
    out = []
    for run in runs:
        state = trial_state(run, run.id in pruned)
        so_far = objective_value(spec.objective, curves.get(run.id, {}))
        trial = Trial(
            number=run.sweep_trial or 0,
            params=trial_params(spec, run, forms),
            value=so_far if state in ("complete", "pruned") else None,
            state=state,
        )
        out.append(SweepTrial(run=run, trial=trial, so_far=so_far))
    return out
