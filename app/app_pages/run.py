"""Run (`?run=ID`): status and actions (and, for a sweep's run, a link to its sweep), live
charts (fragments that redraw themselves when the run changes, while it is live), and tabs
for configuration, samples, LBES, events, checkpoints (each a download link,
app/checkpoints_view.py) and exports."""

import pandas as pd
import streamlit as st

from app import actions, exports, live, live_route, report
from app.alignment_view import alignment_view
from app.checkpoints_view import checkpoints_tab
from app.samples_view import Scope, lbes_view, sample_inspector
from app.state import get_store
from app.ticking_metric import ticking_duration
from app.version_watch import watch_version
from app.views import (
    MISSING,
    cell,
    duration,
    elapsed,
    eta,
    id_param,
    inert,
    mode,
    param,
    set_param,
    show_error,
    show_run_error,
    smoothing_param,
    utc_time,
)
from jobs.liveness import silent_since
from jobs.phases import current_phase, engine_places
from jobs.scheduler import SchedulerSettings
from jobs.store.errors import StoreError

HEARTBEAT_TIMEOUT = SchedulerSettings.from_env().heartbeat_timeout_seconds
X_AXES = {"step": "step", "wall time (min)": "wall_time"}

store = get_store()
run_id = id_param("run")
if run_id is None:
    st.info("Open a run from the **Runs** page (this page's URL is `/run?run=ID`).")
    st.stop()
try:
    run = store.get_run(run_id)
except StoreError as exc:
    show_error(exc)
    st.stop()


def status() -> None:
    """Status; redraws itself while the run is live when it changes, on the state all its
    viewers share (app/live.py), and counts its elapsed time in the browser meanwhile. A
    failed run's error comes first; a run whose engine is starting says so, and since when."""
    state = live.run_state(run.id)
    current = state.run
    if current.status.is_terminal() and not run.status.is_terminal():
        st.rerun(scope="app")  # the run ended: redraw once without the watch
    if live_page:
        watch_run(state, "status_watch", order=0)  # the step first
    if current.error:
        show_run_error(current.error)
    events = state.events
    phase = current_phase(current, events)
    spent = elapsed(current, state.now)
    c1, c2, c3, c4 = st.columns(4)
    c1.metric("Status", phase.name if phase else current.status.value)
    c2.metric("Step", f"{current.step} / {current.total_steps or '?'}")
    with c3:
        if live_page and spent is not None:
            ticking_duration("Elapsed", spent, key="elapsed")
        else:
            st.metric("Elapsed", duration(spent))
    c4.metric("Time left", duration(eta(current, state.now)))
    if phase:
        st.info(
            f"Starting engine since {utc_time(phase.since)}: the model is loading into the "
            "engine (tens of seconds on a CPU); the first step follows."
        )
    if places := engine_places(events):
        label = "Engine" if len(places) == 1 else f"{len(places)} engines"
        st.caption(f"{label}: " + " · ".join(inert(p) for p in places))
    if silent := silent_since(current, HEARTBEAT_TIMEOUT, state.now):
        st.warning(
            f"No heartbeat from this run's worker since {utc_time(silent)}: it may be gone. "
            "`eslab serve` ends such a run once ESLAB_HEARTBEAT_TIMEOUT_S has passed; until "
            f"one runs, the run stays {current.status.value}."
        )


st.title(inert(run.name))
st.caption(
    f"run {run.id} · {run.method} · {mode(run)} · uuid {run.uuid} · "
    f"tags: {inert(', '.join(run.tags)) or MISSING}"
)
if run.sweep_id is not None:
    st.page_link(
        actions.SWEEP_PAGE,
        label=inert(f"Trial {run.sweep_trial} of sweep {store.get_sweep(run.sweep_id).name}"),
        icon=":material/insights:",
        query_params={"sweep": str(run.sweep_id)},
    )


def watch_run(state: live.RunState, key: str, order: int) -> None:
    """Reruns the calling fragment once the run differs from `state` (app/version_watch.py),
    the fragments of lower `order` first."""
    path, subject = live_route.run_path(run.id), live_route.run_subject(run.id)
    watch_version(path, subject, state.version, key=key, order=order)


live_page = not run.status.is_terminal()
st.fragment(status)()
# The actions sit outside the status: which are enabled changes only when the run ends, and
# then the status redraws the whole page. Redrawn every second, the three buttons were 40%
# of that rerun's time (py-spy, 20 viewers).
actions.buttons(store, run, "run")

o1, o2 = st.columns(2)
axis_names = list(X_AXES)
axis = o1.radio(
    "x-axis",
    axis_names,
    horizontal=True,
    key="run_x",
    index=axis_names.index(param("x")) if param("x") in X_AXES else 0,
)
smoothing = o2.slider("Smoothing (EMA)", 0.0, 0.99, smoothing_param(), 0.01, key="run_smooth")
set_param("x", "" if axis == "step" else axis)
set_param("smooth", "" if smoothing == 0 else f"{smoothing:g}")
x = X_AXES[axis]


def live_charts() -> None:
    """The charts, built once per recorded step for all viewers (app/live.py); redrawn
    when the run changes."""
    state = live.run_state(run.id)
    current = state.run
    if live_page:
        watch_run(state, "charts_watch", order=1)
    fitness, figures = live.run_charts_at(
        run.id, current.step, current.status.value, x, smoothing, current
    )
    if fitness is None:
        st.info("No steps recorded yet; charts appear after the first step.")
        return
    st.vega_lite_chart(fitness)
    columns = st.columns(2)
    for i, figure in enumerate(figures):
        columns[i % 2].vega_lite_chart(figure)


st.fragment(live_charts)()

config_tab, samples_tab, lbes_tab, align_tab, events_tab, ckpt_tab, export_tab = st.tabs(
    ["Configuration", "Samples", "LBES", "Alignment", "Events", "Checkpoints", "Export"],
    key="tab",
    bind="query-params",
)
with config_tab:
    st.dataframe(
        pd.DataFrame({"option": list(run.config), "value": [cell(v) for v in run.config.values()]}),
        hide_index=True,
    )
with samples_tab:
    sample_inspector(store, run, Scope("run_samples"))
with lbes_tab:
    lbes_view(store, run)
with align_tab:
    alignment_view(store, run)
with events_tab:
    events = store.events(run.id)
    if events:
        st.dataframe(
            pd.DataFrame([e.__dict__ for e in events]), hide_index=True, placeholder=MISSING
        )
    else:
        st.info("No events yet.")
with ckpt_tab:
    checkpoints_tab(store, run)
with export_tab:
    too_large = exports.run_json_refusal(store, run.id)
    if too_large:
        st.warning(too_large)  # numbers and constants only
    else:
        st.download_button(
            "Run as JSON (everything)",
            lambda: exports.run_json(store, run.id),
            exports.file_name(run, ".json"),
            "application/json",
            icon=":material/download:",
        )
    st.download_button(
        "Metrics as CSV",
        lambda: exports.metrics_csv(store, run.id),
        exports.file_name(run, ".csv", "metrics"),
        "text/csv",
        icon=":material/download:",
    )
    st.download_button(
        "Report as HTML (charts included, opens offline)",
        lambda: report.run_report(store, run.id),
        exports.file_name(run, ".html"),
        "text/html",
        icon=":material/download:",
    )
