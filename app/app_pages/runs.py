"""Runs: search, filter and sort every run; open, compare, cancel, clone or resume them; a
sweep's run links to its sweep.
Filters, sort and page live in the URL; one page of runs is read at a time. While a listed
run is queued or running the table redraws itself when a run changes (a fragment that
watches the Runs page's version, app/version_watch.py), and stops watching when none is."""

import streamlit as st

from app import actions, auth, live, live_route
from app.state import get_store
from app.version_watch import watch_version
from app.views import (
    MISSING,
    inert,
    label,
    page_param,
    param,
    param_list,
    set_param,
)
from jobs.store.records import RunRecord
from jobs.store.status import RunStatus

PAGE_SIZE = 50
SORTS = {
    "newest": "-created_at",
    "oldest": "created_at",
    "name": "name",
    "status": "status",
    "method": "method",
    "most steps": "-step",
}

st.title("Runs")
store = get_store()

c1, c2, c3, c4, c5 = st.columns([3, 3, 2, 2, 2])
text = c1.text_input("Search", param("q"), placeholder="name, id or uuid")
statuses = c2.multiselect(
    "Status", [s.value for s in RunStatus], [s for s in param_list("status") if s in set(RunStatus)]
)
methods = c3.multiselect(
    "Method", ["es", "lbes"], [m for m in param_list("method") if m in ("es", "lbes")]
)
tag = c4.text_input("Tag", param("tag"))
sort_names = list(SORTS)
sort = c5.selectbox(
    "Sort",
    sort_names,
    index=sort_names.index(param("sort", "newest")) if param("sort", "newest") in SORTS else 0,
)
for name, value in (
    ("q", text),
    ("status", statuses),
    ("method", methods),
    ("tag", tag),
    ("sort", "" if sort == "newest" else sort),
):
    set_param(name, value)


def search(page: int) -> tuple[list[RunRecord], int]:
    """Page `page` (from 1) of the runs the filters select, and how many they select."""
    listing = listing_of(page, live.runs_version())
    return list(listing.runs), listing.total


def listing_of(page: int, version: live.Version) -> live.RunsListing:
    """Page `page` of the filtered runs and its table, as shared by all its viewers, read
    after `version`."""
    return live.runs_listing(
        live.RunFilters(
            text=text,
            statuses=tuple(statuses),
            methods=tuple(methods),
            tag=tag,
            order=SORTS[sort],
            limit=PAGE_SIZE,
            offset=PAGE_SIZE * max(0, page - 1),
        ),
        version,
    )


runs, total = search(page_param())
if total == 0:
    st.info(
        "No runs match."
        if store.count_runs()
        else "No runs exist yet: open **New run** or use `eslab submit run.yaml`."
    )
    st.stop()

pages = -(-total // PAGE_SIZE)
page = min(page_param(), pages)
if pages > 1:
    page = st.number_input(f"Page (of {pages}, {total} runs)", 1, pages, page)
    set_param("page", "" if page == 1 else str(page))
    runs, _ = search(page)


def any_live(listed: list[RunRecord]) -> bool:
    return any(not r.status.is_terminal() for r in listed)


def table_and_actions(refreshing: bool) -> None:
    """The table of this page of runs and the buttons acting on the selected ones."""
    version = live.runs_version()
    listing = listing_of(page, version)
    shown = list(listing.runs)
    if refreshing and not any_live(shown):
        st.rerun(scope="app")  # the last live run ended: redraw once without the watch
    if refreshing:
        watch_version(live_route.RUNS_PATH, live_route.RUNS_SUBJECT, version, key="runs_watch")
    table = listing.table
    event = st.dataframe(
        table,
        hide_index=True,
        on_select="rerun",
        selection_mode="multi-row",
        key="runs_table",
        placeholder=MISSING,
        column_config={
            "progress": st.column_config.ProgressColumn("progress", min_value=0, max_value=1),
            "train reward": st.column_config.LineChartColumn("train reward"),
            "created": st.column_config.DatetimeColumn("created", format="YYYY-MM-DD HH:mm"),
            "sweep": st.column_config.LinkColumn(
                "sweep", display_text=r"sweep=(\d+)", help="the sweep the run is a trial of"
            ),
            "open": st.column_config.LinkColumn("open", display_text="open"),
        },
    )
    selected = [shown[i] for i in event.selection.rows if i < len(shown)]
    st.caption(
        f"{total} runs · page {page} of {pages} · selected: "
        + (inert(", ".join(label(r) for r in selected)) or "none")
        + (" · redrawn when a run changes" if refreshing else "")
    )

    editor = auth.can_edit()
    b1, b2, b3, b4, b5, b6 = st.columns(6)
    if b1.button("Open", disabled=len(selected) != 1, icon=":material/open_in_new:"):
        st.switch_page(actions.RUN_PAGE, query_params={"run": str(selected[0].id)})
    if b2.button(
        "Compare",
        disabled=not 2 <= len(selected) <= actions.MAX_COMPARE_RUNS,
        icon=":material/compare:",
        help=f"Two to {actions.MAX_COMPARE_RUNS} runs.",
    ):
        st.switch_page(
            actions.COMPARE_PAGE, query_params={"runs": ",".join(str(r.id) for r in selected)}
        )
    if not editor:
        b3.caption("Viewers cannot clone, cancel, resume or delete runs.")
        return
    if b3.button("Clone", disabled=len(selected) != 1, icon=":material/content_copy:"):
        actions.clone(selected[0].id)
    for column, title, icon, allowed, act in (
        (b4, "Cancel", ":material/stop:", actions.can_cancel, actions.cancel),
        (b5, "Resume", ":material/play_arrow:", actions.can_resume, actions.resume),
    ):
        if column.button(title, disabled=not any(allowed(r) for r in selected), icon=icon):
            for r in selected:
                if allowed(r):
                    act(store, r.id)
            st.rerun()
    if b6.button(
        "Delete",
        disabled=not selected or not all(actions.can_delete(r) for r in selected),
        icon=":material/delete:",
    ):
        actions.confirm_delete(store, selected)


refreshing = any_live(runs)
st.fragment(table_and_actions)(refreshing)
