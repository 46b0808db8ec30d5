"""The samples inspector (Run page tab and Samples page) and the LBES view."""

from __future__ import annotations

from dataclasses import asdict

import pandas as pd
import streamlit as st

from app.views import param, set_param
from jobs.store.records import RunRecord
from jobs.store.store import Store

SPLITS = ("train", "eval")


def _step_picker(steps: list[int], key: str, url: str) -> int:
    wanted = int(param(url)) if param(url).isdigit() and int(param(url)) in steps else steps[-1]
    if len(steps) == 1:
        st.caption(f"step {steps[0]}")
        return steps[0]
    step = st.select_slider("Step", steps, value=wanted, key=key)
    set_param(url, "" if step == steps[-1] else str(step))
    return step


def samples_table(store: Store, run: RunRecord, prefix: str) -> None:
    """Completions of one split and step, filtered by reward; split/step/min reward in the URL."""
    c1, c2 = st.columns([1, 3])
    split = c1.radio(
        "Split",
        SPLITS,
        index=SPLITS.index(param("split", "train")) if param("split", "train") in SPLITS else 0,
        key=f"{prefix}_split",
        horizontal=True,
    )
    set_param("split", "" if split == "train" else split)
    steps = store.sample_steps(run.id, split)
    if not steps:
        st.info(f"Run {run.id} has no {split} samples yet.")
        return
    with c2:
        step = _step_picker(steps, f"{prefix}_step", "step")
    rows = pd.DataFrame([asdict(x) for x in store.samples(run.id, split=split, step=step)])
    rewards = rows["reward"].dropna()
    if len(rewards) and rewards.min() < rewards.max():
        low, high = st.slider(
            "Reward between",
            float(rewards.min()),
            float(rewards.max()),
            (float(rewards.min()), float(rewards.max())),
            key=f"{prefix}_reward",
        )
        rows = rows[rows["reward"].between(low, high) | rows["reward"].isna()]
    st.caption(f"{len(rows)} samples at step {step}")
    columns = [
        "prompt_index",
        "sample_index",
        "member",
        "reward",
        "reward_parts",
        "prompt",
        "completion",
        "logprob",
        "kept",
        "dropped_by",
    ]
    st.dataframe(
        rows[columns],
        hide_index=True,
        key=f"{prefix}_table",
        column_config={
            "prompt": st.column_config.TextColumn(width="medium"),
            "completion": st.column_config.TextColumn(width="large"),
        },
    )


def lbes_view(store: Store, run: RunRecord) -> None:
    """Per step: every member's fitness (the correlation under LBES) and which samples the
    filters kept or dropped, and why."""
    steps = store.population_steps(run.id)
    if not steps:
        st.info("No population rows yet.")
        return
    step = _step_picker(steps, "run_lbes_step", "lbes_step")
    population = pd.DataFrame(store.population(run.id, step))
    what = "correlation" if run.method == "lbes" else "fitness (mean reward)"
    st.markdown(f"**Members at step {step}** — fitness is the {what}")
    st.dataframe(population, hide_index=True)
    samples = pd.DataFrame([asdict(x) for x in store.samples(run.id, split="train", step=step)])
    if samples.empty:
        return
    samples["outcome"] = samples["kept"].map({True: "kept", False: "dropped"}).fillna("n/a")
    reasons = samples.fillna({"dropped_by": "-"}).groupby(["outcome", "dropped_by"]).size()
    st.markdown("**Filters**")
    st.dataframe(reasons.rename("samples").reset_index(), hide_index=True)
    st.dataframe(
        samples[
            [
                "prompt_index",
                "sample_index",
                "reward",
                "logprob",
                "kept",
                "dropped_by",
                "completion",
            ]
        ],
        hide_index=True,
    )
