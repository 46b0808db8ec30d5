"""The Run page's Alignment tab: lambda and J_C, mean reward and cost, the safe ratio, each
ensemble member's score, one step's population (histograms of the reward and the cost of
every sample of every member and their reward-vs-cost scatter, the reference's
`helpfulness/dist`, `cost/dist` and `scatter/reward_vs_cost`), a reward-vs-cost scatter of the
completions logged at one step, and best-of-n curves of the run's checkpoints (`eslab bon`
writes CHECKPOINT/bon.json)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import altair as alt
import pandas as pd
import streamlit as st

from app import charts
from app.samples_view import _step_picker
from engine import metrics as mk
from engine.best_of_n.evaluation import read_curves
from engine.paths import resolve_path
from jobs.store.records import RunRecord
from jobs.store.store import Store

COST = "cost"  # engine.scoring.sources.COST, the sample part that holds C
MEMBER_PREFIX = f"{mk.TRAIN}/member/"


def _lines(store: Store, run: RunRecord, keys: dict[str, str], title: str) -> alt.Chart | None:
    """Several metrics on one chart, coloured by their label."""
    frames = [
        charts.frame(store.metric_buckets(run.id, key)).assign(series=label)
        for key, label in keys.items()
    ]
    frames = [f for f in frames if not f.empty]
    if not frames:
        return None
    key = next(iter(keys)) if len(keys) == 1 else None  # one metric: its key under the title
    return charts.metric_chart(
        pd.concat(frames), "step", title, color="series", band=False, key=key
    )


def alignment_view(store: Store, run: RunRecord) -> None:
    keys = store.metric_keys(run.id)
    if mk.LAMBDA not in keys:
        st.info("Not an alignment run: set scorer_url (and reward_source) to weigh a cost.")
        return
    members = {
        k: k[len(MEMBER_PREFIX) :].rsplit("/", 1)[0]
        for k in keys
        if k.startswith(MEMBER_PREFIX) and k.endswith("/mean")
    }
    figures = [
        _lines(store, run, {mk.LAMBDA: "lambda"}, "lambda"),
        _lines(store, run, {mk.JC_RAW: "raw", mk.JC_SMOOTHED: "smoothed"}, "J_C = mean(C) - d"),
        _lines(
            store,
            run,
            {mk.reward_key(mk.TRAIN): "reward", mk.reward_key(mk.TRAIN, COST): "cost"},
            "mean reward and cost",
        ),
        _lines(
            store,
            run,
            {mk.SAFE_RATIO: "population", mk.BASE_SAFE_RATIO: "unperturbed"},
            "safe ratio (cost <= 0)",
        ),
        _lines(store, run, members, "ensemble members' mean score") if members else None,
    ]
    columns = st.columns(2)
    for i, figure in enumerate(f for f in figures if f is not None):
        columns[i % 2].altair_chart(figure)
    _population(store, run)
    _scatter(store, run)
    _best_of_n(store, run)


@dataclass(frozen=True)
class Scores:
    """One step's rewards and costs, a row per sample or per member, and the charts' words."""

    rows: pd.DataFrame
    unit: str  # what a row is: "samples" or "members"
    histogram: str  # a histogram's title, of {field} at {step}
    scatter: str  # the scatter's title, at {step}


def step_scores(store: Store, run: RunRecord, step: int) -> Scores:
    """Every sample of every member at `step`, as the reference histograms and scatters them,
    where the run recorded its samples' scores (population rows of alignment runs); the
    members' means for rows written without them (runs of an older ES Lab)."""
    samples = pd.DataFrame(store.sample_scores(run.id, step))
    if not samples.empty:
        return Scores(
            samples.dropna(subset=["reward", COST]),
            "samples",
            "{field} of every sample at step {step}",
            "reward vs cost of every sample at step {step}",
        )
    members = pd.DataFrame(store.population(run.id, step))
    return Scores(
        members.dropna(subset=["reward", COST]) if not members.empty else members,
        "members",
        "members' mean {field} at step {step}",
        "members' reward vs cost at step {step}",
    )


def _population(store: Store, run: RunRecord) -> None:
    steps = store.population_steps(run.id)
    if not steps:
        return
    st.subheader("Population")
    step = _step_picker(steps, "run_alignment_population_step", "population_step")
    scores = step_scores(store, run, step)
    if scores.rows.empty:
        st.caption(f"Step {step} has no members with a reward and a cost.")
        return
    left, right = st.columns(2)
    for field in ("reward", COST):
        left.altair_chart(_histogram(scores, field, step))
    right.altair_chart(_population_scatter(scores, step))


def _histogram(scores: Scores, field: str, step: int) -> alt.Chart:
    return (
        alt.Chart(scores.rows)
        .mark_bar()
        .encode(
            x=alt.X(f"{field}:Q", bin=alt.Bin(maxbins=30), title=field),
            y=alt.Y("count():Q", title=scores.unit),
        )
        .properties(title=scores.histogram.format(field=field, step=step), height=160)
    )


def _population_scatter(scores: Scores, step: int) -> alt.Chart:
    tooltip = [
        c
        for c in ("member", "seed", "reward", COST, "fitness", "shaped_fitness")
        if c in scores.rows
    ]
    return (
        alt.Chart(scores.rows)
        .mark_circle(size=40, opacity=0.7)
        .encode(
            x=alt.X("reward:Q"),
            y=alt.Y(f"{COST}:Q"),
            color=alt.Color("fitness:Q", title="member's fitness"),
            tooltip=tooltip,
        )
        .properties(title=scores.scatter.format(step=step), height=340)
    )


def _scatter(store: Store, run: RunRecord) -> None:
    steps = store.sample_steps(run.id, "train")
    if not steps:
        return
    step = _step_picker(steps, "run_alignment_step", "alignment_step")
    rows = [asdict(s) for s in store.samples(run.id, split="train", step=step)]
    df = pd.DataFrame(
        [
            {
                "reward": r["reward"],
                COST: r["reward_parts"].get(COST),
                "model": "unperturbed" if r["member"] is None else f"member {r['member']}",
                "completion": r["completion"],
            }
            for r in rows
        ]
    ).dropna()
    if df.empty:
        return
    st.altair_chart(
        alt.Chart(df)
        .mark_circle(size=40, opacity=0.7)
        .encode(
            x=alt.X("reward:Q"),
            y=alt.Y(f"{COST}:Q"),
            color=alt.Color("model:N"),
            tooltip=["model", "reward", COST, "completion"],
        )
        .properties(title=f"reward vs cost of the completions logged at step {step}", height=300)
    )


def _best_of_n(store: Store, run: RunRecord) -> None:
    curves = []
    for ckpt in store.checkpoints(run.id):
        path = resolve_path(ckpt.path) / "bon.json"
        if not path.is_file():
            continue
        for key, points in read_curves(path).items():
            label = f"step {ckpt.step}" + (f" {key}" if key else "")
            for p in points:
                curves += [
                    {"n": p["n"], "score": p["proxy_score"], "kind": "proxy", "checkpoint": label},
                    {"n": p["n"], "score": p["gold_score"], "kind": "gold", "checkpoint": label},
                ]
    if not curves:
        st.caption("Best-of-n: run `eslab bon RUN --gold SPEC` to add curves here.")
        return
    st.altair_chart(
        alt.Chart(pd.DataFrame(curves))
        .mark_line(point=True)
        .encode(
            x=alt.X("n:Q", scale=alt.Scale(type="log", base=2)),
            y="score:Q",
            color="checkpoint:N",
            strokeDash="kind:N",
            tooltip=["checkpoint", "kind", "n", "score"],
        )
        .properties(title="best-of-n: proxy vs gold score", height=280)
    )
