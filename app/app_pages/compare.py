"""Compare (`?runs=ID,ID,...`): any metric overlaid, a configuration diff (only differences
by default), a summary table, and the completions of one prompt side by side."""

import pandas as pd
import streamlit as st

from app import actions, charts, forms
from app.state import get_store
from app.views import (
    MISSING,
    cell,
    duration,
    elapsed,
    id_params,
    inert,
    label,
    mode,
    number,
    param,
    set_param,
    show_error,
    smoothing_param,
)
from engine import metrics as mk
from jobs.store.errors import StoreError

X_AXES = {"step": "step", "wall time (min)": "wall_time"}

st.title("Compare")
store = get_store()
try:
    runs = [store.get_run(i) for i in id_params("runs", most=actions.MAX_COMPARE_RUNS)]
except StoreError as exc:
    show_error(exc)
    st.stop()
if len(runs) < 2:
    st.info(
        f"Select two to {actions.MAX_COMPARE_RUNS} runs on the **Runs** page and press Compare "
        "(this page's URL is `/compare?runs=ID,ID`)."
    )
    st.stop()
st.caption(" · ".join(inert(label(r)) for r in runs))

keys = sorted({k for r in runs for k in store.metric_keys(r.id)})
default = mk.reward_key(mk.TRAIN)
c1, c2, c3 = st.columns([3, 2, 2])
metric = c1.selectbox(
    "Metric",
    keys or [default],
    index=keys.index(param("metric", default)) if param("metric", default) in keys else 0,
)
axis_names = list(X_AXES)
axis = c2.radio(
    "x-axis",
    axis_names,
    horizontal=True,
    index=axis_names.index(param("x")) if param("x") in X_AXES else 0,
)
smoothing = c3.slider("Smoothing (EMA)", 0.0, 0.99, smoothing_param(), 0.01)
set_param("metric", "" if metric == default else metric)
set_param("x", "" if axis == "step" else axis)
set_param("smooth", "" if smoothing == 0 else f"{smoothing:g}")

x = X_AXES[axis]
lines = [
    charts.frame(store.metric_buckets(r.id, metric), x, smoothing).assign(run=label(r))
    for r in runs
]
data = pd.concat(lines, ignore_index=True)
if data.empty:
    st.info(f"None of these runs recorded {inert(metric)} yet.")
else:
    st.altair_chart(
        charts.metric_chart(data, x, charts.words(metric), color="run", height=320, key=metric)
    )

st.subheader("Summary")
latest = store.latest_metrics([r.id for r in runs])
best = store.best_metrics([r.id for r in runs], mk.reward_key(mk.EVAL))
st.dataframe(
    pd.DataFrame(
        [
            {
                "run": label(r),
                "status": r.status.value,
                "method": r.method,
                "mode": mode(r),
                "step": f"{r.step} / {r.total_steps or '?'}",
                "elapsed": duration(elapsed(r)),
                "train reward (last)": latest[r.id].get(mk.reward_key(mk.TRAIN)),
                "eval reward (best)": best.get(r.id),
                metric + " (last)": latest[r.id].get(metric),
            }
            for r in runs
        ]
    ),
    hide_index=True,
    placeholder=MISSING,
)

st.subheader("Configuration")
only = st.toggle("Only differences", value=param("all") != "1")
set_param("all", "" if only else "1")
# Values as text: a column holding a number for one option and a word for the next is one
# Arrow cannot convert.
as_text = {label(r): {k: cell(v) for k, v in r.config.items()} for r in runs}
st.dataframe(forms.config_diff(as_text, only), hide_index=True)

st.subheader("Same prompt, side by side")
s1, s2, s3 = st.columns(3)
split = s1.radio("Split", ["eval", "train"], horizontal=True, key="compare_split")
common = sorted(set.intersection(*(set(store.sample_steps(r.id, split)) for r in runs)))
if not common:
    st.info(f"These runs share no step with {split} samples.")
    st.stop()
step = s2.selectbox("Step", common, index=len(common) - 1)
by_run = {label(r): store.samples(r.id, split=split, step=step) for r in runs}
prompts = sorted({x.prompt_index for xs in by_run.values() for x in xs})
prompt = s3.selectbox("Prompt", prompts)
cols = st.columns(len(runs))
for col, (name, samples) in zip(cols, by_run.items(), strict=True):
    with col:
        st.markdown(f"**{inert(name)}**")
        for x in [s for s in samples if s.prompt_index == prompt][:4]:
            st.caption(f"sample {x.sample_index} · reward {number(x.reward)}")
            st.text(x.completion)
