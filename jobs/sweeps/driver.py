"""Running sweeps: start one, advance every active one on each scheduler tick, cancel one, and
the table of its runs.

A sweep's runs are ordinary runs, queued through jobs.launch (the path of `eslab submit`) as
trials `<sweep>-t001`, `<sweep>-t002`, ... tagged `sweep:<sweep>` and the sweep's own tags,
each in its own folder under the sweep's output_dir; the scheduler starts them within its
usual limits (`max_concurrent_runs`, the cluster's resources), first in, first out with any
other run.

`advance_sweeps` is the scheduler's step before it submits queued runs (jobs.scheduler). For
every active sweep it rebuilds the trials from the database (history.py), stops early the
running runs that the sweep's rule gives up on (a cancel, with the reason as an event of the
run), queues the sampler's next trials while fewer than `parallel` runs of the sweep are
live, and marks the sweep finished once nothing is live and the sampler has nothing more to
ask. It holds no state between ticks, and every write it makes is one a repeated or racing
pass cannot double: a trial number is stored once (unique in the database), a run joins only
an active sweep, and a status moves only from the one it was read in.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pandas as pd

from engine.config import ConfigError, FieldError, RunConfig
from engine.config.rules import run_name_problem
from engine.data.datasets import DatasetError
from engine.data.local import default_output_dir
from engine.model_files import ModelError
from engine.rewards import RewardError
from jobs.launch import queue_run
from jobs.planning import default_run_name, plan_run
from jobs.store.errors import (
    InvalidTransitionError,
    SweepClosedError,
    TrialTakenError,
)
from jobs.store.records import RunRecord, SweepRecord
from jobs.store.status import RunStatus, SweepStatus
from jobs.store.store import Store
from jobs.sweeps.configs import trial_config
from jobs.sweeps.history import SweepTrial, pruned_event, read_trials
from jobs.sweeps.objective import rank
from jobs.sweeps.samplers import Trial, next_number, suggest
from jobs.sweeps.spec import SweepSpec
from jobs.sweeps.stopping import should_stop

log = logging.getLogger(__name__)

TRIAL_DIGITS = 3
PLAN_ERRORS = (ConfigError, DatasetError, RewardError, ModelError)
"""What refuses a run before it is stored (jobs.planning): for a trial, a failed trial."""


def sweep_tag(name: str) -> str:
    return f"sweep:{name}"


def trial_tags(name: str, tags: Sequence[str]) -> list[str]:
    """What each run of the sweep `name` tagged `tags` is tagged: `sweep:NAME`, then the
    sweep's tags, each once."""
    return list(dict.fromkeys([sweep_tag(name), *tags]))


def trial_name(sweep_name: str, number: int) -> str:
    return f"{sweep_name}-t{number:0{TRIAL_DIGITS}d}"


def sweep_base(sweep: SweepRecord) -> RunConfig:
    """The configuration the sweep's runs vary (output_dir: the folder of their folders)."""
    return RunConfig.from_flat(sweep.base_config)


# -- starting ---------------------------------------------------------------------------


def start_sweep(
    store: Store,
    base: RunConfig,
    spec: SweepSpec,
    *,
    name: str | None = None,
    created_by: str | None = None,
    tags: Sequence[str] = (),
) -> SweepRecord:
    """Store an active sweep of `spec` over `base` (both already checked together:
    spec.parse_space), its runs to be tagged with `tags` (each once, in their order) besides
    `sweep:NAME`. What a run checks before it is queued (datasets, reward function, model) is
    checked here on `base`, so a sweep that could queue no run is refused before anything is
    stored. The scheduler of `eslab serve` queues its runs.

    Raises ConfigError (naming the field), DatasetError, RewardError, ModelError, or
    StoreError when the name is taken."""
    name = name or base.logging.run_name or f"sweep-{default_run_name(base)}"
    longest = trial_name(name, spec.budget)
    if problem := run_name_problem(longest):
        why = f"the sweep name {name[:100]!r} names its runs like {longest[:100]!r}, but a run name"
        raise ConfigError([FieldError("name", f"{why} {problem}")])
    output_dir = base.data.output_dir or default_output_dir(name)
    base = base.with_overrides([f"output_dir={output_dir}"])
    plan_run(base, name=longest)  # refuses what every trial would be refused for
    return store.create_sweep(
        name=name,
        spec=spec.to_dict(),
        base_config=base.with_resolved_paths().to_dict(),
        created_by=created_by,
        tags=list(dict.fromkeys(tags)),
    )


# -- the scheduler's step ---------------------------------------------------------------


def advance_sweeps(store: Store) -> None:
    """One pass over the active sweeps (see the module docstring). Never raises: a sweep
    whose pass fails is logged and tried again at the next tick, and the other sweeps and
    the scheduler's submissions go on."""
    try:
        store.reopen_sweeps()
        sweeps = store.active_sweeps()
    except Exception:
        log.exception("sweeps: could not list the active sweeps; the next tick tries again")
        return
    for sweep in sweeps:
        try:
            advance(store, sweep)
        except Exception:
            log.exception(
                "sweep %s (%s): this pass failed; the next tick tries again", sweep.id, sweep.name
            )


def advance(store: Store, sweep: SweepRecord) -> None:
    """One pass over one sweep: stop early, queue, finish."""
    spec = SweepSpec.from_dict(sweep.spec)
    runs = store.sweep_runs(sweep.id)
    curves = store.metric_curves([r.id for r in runs], spec.objective.metric)
    trials = read_trials(store, spec, sweep_base(sweep), runs, curves)
    trials = stop_early(store, spec, trials, curves)
    history = [t.trial for t in trials]
    live = sum(1 for t in trials if not t.run.status.is_terminal())  # queued, running, stopping
    while live < spec.parallel:
        params = suggest(spec, history)
        if params is None:
            if live == 0 and store.set_sweep_status(
                sweep.id, SweepStatus.FINISHED, expected=[SweepStatus.ACTIVE]
            ):
                log.info("sweep %s (%s) finished: %d runs", sweep.id, sweep.name, len(history))
            return
        number = next_number(history)
        run = queue_trial(store, sweep, number, params)
        if run is None:
            return  # the sweep was cancelled, or another pass queued this trial: next tick
        state = "failed" if run.status is RunStatus.FAILED else "running"
        history.append(Trial(number=number, params=params, value=None, state=state))
        live += state == "running"


def stop_early(
    store: Store,
    spec: SweepSpec,
    trials: list[SweepTrial],
    objective_curves: Mapping[int, Mapping[int, float]],
) -> list[SweepTrial]:
    """Cancel each running run that the sweep's early-stopping rule gives up on, with the
    rule's reason as an event of the run; the trials with those marked pruned."""
    rule = spec.early_stopping
    if rule is None or not any(t.run.status is RunStatus.RUNNING for t in trials):
        return trials
    runs = [t.run for t in trials]
    curves = (
        objective_curves
        if rule.metric == spec.objective.metric
        else store.metric_curves([r.id for r in runs], rule.metric)
    )
    out = []
    for t in trials:
        if t.run.status is RunStatus.RUNNING:
            others = [curves[r.id] for r in runs if r.id != t.run.id and curves[r.id]]
            reason = should_stop(rule, spec.objective.mode, curves[t.run.id], others)
            if reason is not None and prune(store, t.run, reason):
                t = replace(t, trial=replace(t.trial, state="pruned", value=t.so_far))
        out.append(t)
    return out


def prune(store: Store, run: RunRecord, reason: str) -> bool:
    """Cancel `run` as `eslab cancel` does, the reason recorded with the cancel; False when it
    ended meanwhile."""
    try:
        store.request_cancel(run.id, reason=pruned_event(run.attempt, reason))
    except InvalidTransitionError:
        return False
    log.info("run %s stopped early: %s", run.id, reason)
    return True


def queue_trial(
    store: Store, sweep: SweepRecord, number: int, params: dict[str, Any]
) -> RunRecord | None:
    """Queue trial `number` of `sweep` with `params`, in its own folder inside the base's
    output_dir. A trial that cannot run (the configuration, dataset, reward or model refused
    it) is stored as a failed run with the reason, so the sweep goes on; None when the sweep
    is no longer active or the trial was queued by another pass."""
    name = trial_name(sweep.name, number)
    base = sweep_base(sweep)
    own = {**params, "run_name": name, "output_dir": str(Path(base.data.output_dir or "") / name)}
    link: dict[str, Any] = {"sweep_id": sweep.id, "sweep_trial": number}
    tags = trial_tags(sweep.name, sweep.tags)
    try:
        try:
            config = trial_config(base, own)
            return queue_run(store, config, name=name, tags=tags, **link)
        except PLAN_ERRORS as exc:
            flat = {**base.to_flat(), **own}
            run = store.create_run(name=name, method=base.method, config=flat, tags=tags, **link)
            error = f"the sweep could not queue this trial: {exc}"
            store.finish_run(run.id, RunStatus.FAILED, error=error, event=error)
            return store.get_run(run.id)
    except (SweepClosedError, TrialTakenError) as exc:
        log.info("sweep %s: %s", sweep.id, exc)
        return None


# -- cancelling -------------------------------------------------------------------------


def cancel_sweep(store: Store, sweep: int | str) -> list[RunRecord]:
    """Mark the sweep cancelled (it queues nothing more), then cancel its queued and running
    runs as `eslab cancel` does; the runs cancelled. A run that ends meanwhile is left as it
    ended. InvalidTransitionError when the sweep is not active."""
    record = store.get_sweep(sweep)
    if not store.set_sweep_status(record.id, SweepStatus.CANCELLED, expected=[SweepStatus.ACTIVE]):
        now = store.get_sweep(record.id).status
        raise InvalidTransitionError(
            f"sweep {record.id} is already {now.value}; there is nothing to cancel"
        )
    cancelled = []
    for run in store.sweep_runs(record.id):
        if run.status in (RunStatus.QUEUED, RunStatus.RUNNING):
            try:
                cancelled.append(store.request_cancel(run.id, reason="its sweep was cancelled"))
            except InvalidTransitionError:
                continue
    return cancelled


# -- reading ----------------------------------------------------------------------------


def sweep_trials(store: Store, sweep: int | str) -> list[SweepTrial]:
    """The sweep's runs as trials, in trial order."""
    record = store.get_sweep(sweep)
    spec = SweepSpec.from_dict(record.spec)
    runs = store.sweep_runs(record.id)
    curves = store.metric_curves([r.id for r in runs], spec.objective.metric)
    return read_trials(store, spec, sweep_base(record), runs, curves)


def sweep_table(store: Store, sweep: int | str) -> pd.DataFrame:
    """One row per run of the sweep, in trial order: trial, run id and name, run status,
    trial state, step, each swept option, the objective (of what the run recorded so far)
    and the rank of the complete trials (1 = the best)."""
    record = store.get_sweep(sweep)
    spec = SweepSpec.from_dict(record.spec)
    trials = sweep_trials(store, record.id)
    ranks = {t.run.id: i for i, t in enumerate(ranked(trials, spec.objective.mode), start=1)}
    rows = [
        {
            "trial": t.trial.number,
            "run_id": t.run.id,
            "run": t.run.name,
            "status": t.run.status.value,
            "state": t.trial.state,
            "step": t.run.step,
            **t.trial.params,
            "objective": t.so_far,
            "rank": ranks.get(t.run.id),
        }
        for t in trials
    ]
    columns = ["trial", "run_id", "run", "status", "state", "step"]
    columns += [p.name for p in spec.parameters] + ["objective", "rank"]
    return pd.DataFrame(rows, columns=columns).astype({"rank": "Int64"})


def ranked(trials: Sequence[SweepTrial], mode: str) -> list[SweepTrial]:
    """The complete trials with an objective, the best first (objective.rank)."""
    scored = {
        t.trial.number: t
        for t in trials
        if t.trial.state == "complete" and t.trial.value is not None
    }
    return [scored[t.number] for t in rank([t.trial for t in scored.values()], mode)]
