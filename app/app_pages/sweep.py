"""Sweep (`?sweep=ID`): progress against the budget, the runs ranked by the objective (the
best one a click away, the top k to Compare), the swept options against the objective, the
search as YAML, cancel, and downloads. While the sweep is active its part that changes
redraws itself when the sweep or one of its runs changes (a fragment that watches the
sweep's version, app/version_watch.py), and stops watching once the sweep has ended."""

import pandas as pd
import streamlit as st

from app import actions, auth, exports, live, live_route, report, sweep_view
from app.state import get_store
from app.version_watch import watch_version
from app.views import MISSING, id_param, inert, number, show_error
from jobs.store.errors import StoreError
from jobs.store.status import SweepStatus
from jobs.sweeps.driver import sweep_base
from jobs.sweeps.spec import SweepSpec

TOP_K = 3

store = get_store()
sweep_id = id_param("sweep", "sweep")
if sweep_id is None:
    st.info("Open a sweep from the **Sweeps** page (this page's URL is `/sweep?sweep=ID`).")
    st.stop()
try:
    sweep = store.get_sweep(sweep_id)
except StoreError as exc:
    show_error(exc)
    st.stop()
spec = SweepSpec.from_dict(sweep.spec)
objective = spec.objective

st.title(inert(sweep.name))
st.caption(
    f"sweep {sweep.id} · {spec.method} over {', '.join(p.name for p in spec.parameters)} · "
    f"objective {inert(objective.metric)} ({objective.mode}, {objective.summary}) · "
    f"{spec.parallel} at a time · created {sweep.created_at:%Y-%m-%d %H:%M}"
    + (f" by {inert(sweep.created_by)}" if sweep.created_by else "")
    + (f" · tags {inert(', '.join(sweep.tags))}" if sweep.tags else "")
)


def live_part() -> None:
    """Progress, the best run, the ranked runs, the top k and the chart; redrawn when the
    sweep changes while it is active, on the state all its viewers share (app/live.py)."""
    version = live.sweep_version(sweep.id)
    state = live.sweep_state(sweep.id, version)
    current, table = state.sweep, state.table
    if current.status is not SweepStatus.ACTIVE and sweep.status is SweepStatus.ACTIVE:
        st.rerun(scope="app")  # the sweep ended: redraw once without the watch
    if sweep.status is SweepStatus.ACTIVE:
        path, subject = live_route.sweep_path(sweep.id), live_route.sweep_subject(sweep.id)
        watch_version(path, subject, version, key="sweep_watch")
    done = sweep_view.progress(table, spec.budget)
    columns = st.columns(6)
    for column, title, value in (
        (columns[0], "Status", current.status.value),
        (columns[1], "Runs done", f"{done.done} / {done.budget}"),
        (columns[2], "Queued", done.queued),
        (columns[3], "Running", done.running),
        (columns[4], "Stopped early", done.pruned),
        (columns[5], "Failed", done.failed),
    ):
        column.metric(title, value)
    st.progress(done.fraction)
    if table.empty:
        st.info(
            "No runs yet: the scheduler of `eslab serve` queues the sweep's runs, "
            f"{spec.parallel} at a time."
        )
        return
    top = sweep_view.best(table)
    if top is None:
        st.caption("No run has finished with an objective yet.")
    else:
        st.page_link(
            actions.RUN_PAGE,
            label=inert(
                f"Best run: {top['run']} (#{top['run_id']}), {objective.metric} "
                f"{number(top['objective'])}"
            ),
            icon=":material/trophy:",
            query_params={"run": str(top["run_id"])},
        )
    shown = sweep_view.shown_table(table, spec.parameters)
    st.dataframe(
        sweep_view.highlight_best(shown),
        hide_index=True,
        placeholder=MISSING,
        key="sweep_table",
        column_config={
            "rank": st.column_config.NumberColumn("rank", help="1 = the best finished run"),
            sweep_view.OBJECTIVE: st.column_config.NumberColumn(
                objective.metric,
                help=f"{objective.summary} value, {objective.mode} is best",
                format="%.4g",
            ),
            "open": st.column_config.LinkColumn("open", display_text="open"),
        },
    )
    compare(table)
    if state.chart is not None:
        st.vega_lite_chart(state.chart)


def compare(table: pd.DataFrame) -> None:
    """The k best finished runs on the Compare page (k up to what Compare takes)."""
    finished = len(sweep_view.top_ids(table, len(table)))
    if finished < 2:
        st.caption("Compare opens once two runs have finished with an objective.")
        return
    c1, c2 = st.columns([1, 3], vertical_alignment="bottom")
    most = min(finished, actions.MAX_COMPARE_RUNS)
    k = c1.number_input("Top k", 2, most, min(TOP_K, most), key="top", bind="query-params")
    c2.page_link(
        actions.COMPARE_PAGE,
        label=f"Compare the top {k}",
        icon=":material/compare:",
        query_params={"runs": ",".join(map(str, sweep_view.top_ids(table, int(k))))},
    )


st.fragment(live_part)()

if sweep.status is SweepStatus.ACTIVE:
    if auth.can_edit():
        if st.button("Cancel sweep", icon=":material/stop:", key="sweep_cancel"):
            actions.cancel_sweep(store, sweep.id)
            st.rerun()
    else:
        st.caption("You are a viewer: cancelling a sweep needs an editor.")

space_tab, base_tab, export_tab = st.tabs(
    ["Search space", "Base configuration", "Export"], key="tab", bind="query-params"
)
with space_tab:
    st.code(spec.to_yaml(), language="yaml")
with base_tab:
    st.code(sweep_base(sweep).to_yaml(), language="yaml")
with export_tab:
    st.download_button(
        "Runs as CSV",
        lambda: exports.sweep_csv(store, sweep.id),
        exports.sweep_file_name(sweep, ".csv"),
        "text/csv",
        icon=":material/download:",
    )
    st.download_button(
        "Sweep and runs as JSON",
        lambda: exports.sweep_json(store, sweep.id),
        exports.sweep_file_name(sweep, ".json"),
        "application/json",
        icon=":material/download:",
    )
    st.download_button(
        "Report as HTML (runs ranked, opens offline)",
        lambda: report.sweep_report(store, sweep.id),
        exports.sweep_file_name(sweep, ".html"),
        "text/html",
        icon=":material/download:",
    )
