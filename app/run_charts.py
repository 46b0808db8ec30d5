"""The charts of one run, built from the store: what the Run page shows live and what the
HTML report (app/report.py) draws, so both always show the same figures."""

from __future__ import annotations

import altair as alt
import pandas as pd

from app import charts
from engine import metrics as mk
from engine.config.schema import initial_learning_rate
from engine.schedules import planned_schedule
from jobs.store.records import RunRecord
from jobs.store.store import Store

REWARD_CHARTS = (
    mk.reward_key(mk.TRAIN),
    mk.reward_key(mk.TRAIN, stat="std"),
    mk.reward_key(mk.EVAL),
    mk.TOKENS_PER_SECOND,
)
# (metric, scheduler type option, initial, final, rate, power) of each planned schedule
SCHEDULES = (
    (
        mk.NOISE_STD,
        "noise_std_scheduler_type",
        "noise_std",
        "noise_std_final",
        "noise_std_scheduler_rate",
        "noise_std_scheduler_power",
    ),
    (
        mk.LEARNING_RATE,
        "lr_scheduler_type",
        "learning_rate",
        "lr_final",
        "lr_scheduler_rate",
        "lr_scheduler_power",
    ),
)


def population(store: Store, run: RunRecord) -> alt.LayerChart | None:
    """Every member's fitness per step, or None before the first step."""
    points = pd.DataFrame(
        store.population_points(run.id),
        columns=["step", "member", "seed", "fitness", "shaped_fitness"],
    )
    if points.empty:
        return None
    summary = points.groupby("step")["fitness"].agg(["min", "max", "mean"]).reset_index()
    return charts.population_chart(points, summary)


def schedule(
    store: Store,
    run: RunRecord,
    key: str,
    kind: str,
    initial: str,
    final: str,
    rate: str,
    power: str,
) -> alt.LayerChart:
    """What was used so far and, dashed, the whole planned schedule."""
    cfg = run.config
    done = charts.frame(store.metric_buckets(run.id, key), "step")
    plan = pd.DataFrame(columns=["step", "value"])
    if run.total_steps and cfg.get(kind):
        start = cfg[initial]
        if key == mk.LEARNING_RATE:
            rule = cfg.get("learning_rate_rule", "fixed")
            start = initial_learning_rate(rule, cfg["learning_rate"], cfg["noise_std"])
        values = planned_schedule(
            cfg[kind], start, cfg[final], run.total_steps, cfg[rate], cfg[power]
        )
        # values[k] is what the update of step k + 1 uses, and is recorded at step k + 1.
        steps = range(1, len(values) + 1)
        plan = charts.downsample(pd.DataFrame({"step": steps, "value": values}), "step", "value")
    return charts.planned_chart(done, plan, key)


def eval_sets_figure(
    store: Store, run: RunRecord, x: str = "step", smoothing: float = 0.0
) -> alt.LayerChart | None:
    """pass@1 of each of the run's eval_sets and their mean, one line each; None for a run
    without eval_sets."""
    keys = [k for k in store.metric_keys(run.id) if mk.EVAL_SET_KEY.fullmatch(k)]
    if not keys:
        return None
    lines = [
        charts.frame(store.metric_buckets(run.id, key), x, smoothing).assign(
            set=mk.EVAL_SET_KEY.fullmatch(key)["name"]
        )
        for key in sorted(keys)
    ]
    mean = charts.frame(store.metric_buckets(run.id, mk.EVAL_SETS_MEAN), x, smoothing)
    frame = pd.concat([*lines, mean.assign(set="mean")])
    return charts.metric_chart(frame, x, "eval pass@1 per set", color="set", band=False)


def metric_figures(
    store: Store, run: RunRecord, x: str = "step", smoothing: float = 0.0
) -> list[alt.LayerChart]:
    """Rewards, tokens/s, the schedules and the time per phase, against `x`."""
    figures = []
    for key in REWARD_CHARTS:
        df = charts.frame(store.metric_buckets(run.id, key), x, smoothing)
        if not df.empty:
            figures.append(charts.metric_chart(df, x, charts.words(key), key=key))
    if (sets := eval_sets_figure(store, run, x, smoothing)) is not None:
        figures.append(sets)
    figures += [schedule(store, run, *options) for options in SCHEDULES]
    phases = [
        charts.frame(store.metric_buckets(run.id, mk.time_key(p)), x).assign(phase=p)
        for p in mk.PHASES
        if p != "step"
    ]
    phases = [p for p in phases if not p.empty]
    if phases:
        figures.append(
            charts.metric_chart(
                pd.concat(phases), x, "seconds per phase", color="phase", band=False
            )
        )
    return figures
