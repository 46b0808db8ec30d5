"""Sweeps: every sweep, newest first, with its progress against the budget and its best run so
far; each opens its Sweep page. While a sweep is active the table redraws itself when a
sweep or one of an active sweep's runs changes (a fragment that watches the Sweeps page's
version, app/version_watch.py), and stops watching when none is."""

import streamlit as st

from app import actions, live, live_route
from app.version_watch import watch_version
from app.views import MISSING
from jobs.store.status import SweepStatus

LIMIT = live_route.SWEEPS_SHOWN

st.title("Sweeps")
if st.button("New sweep", icon=":material/add:"):
    st.switch_page(actions.NEW_PAGE, query_params={"sweep": "1"})


def listing(refreshing: bool) -> None:
    """The table of the newest sweeps, as all its viewers share it (app/live.py)."""
    version = live.sweeps_version(LIMIT)
    sweeps, table = live.sweeps_listing(LIMIT, version)
    if refreshing and not any(s.status is SweepStatus.ACTIVE for s in sweeps):
        st.rerun(scope="app")  # the last active sweep ended: redraw once without the watch
    if refreshing:
        path, subject = live_route.SWEEPS_PATH, live_route.SWEEPS_SUBJECT
        watch_version(path, subject, version, key="sweeps_watch")
    st.dataframe(
        table,
        hide_index=True,
        placeholder=MISSING,
        column_config={
            "progress": st.column_config.ProgressColumn("progress", min_value=0, max_value=1),
            "best": st.column_config.NumberColumn("best", format="%.4g"),
            "best run": st.column_config.LinkColumn("best run", display_text=r"run=(\d+)"),
            "created": st.column_config.DatetimeColumn("created", format="YYYY-MM-DD HH:mm"),
            "open": st.column_config.LinkColumn("open", display_text="open"),
        },
    )
    st.caption(
        f"{len(sweeps)} sweeps"
        + (f" (the newest {LIMIT})" if len(sweeps) == LIMIT else "")
        + (" · redrawn when a sweep changes" if refreshing else "")
    )


first, _ = live.sweeps_listing(LIMIT, live.sweeps_version(LIMIT))  # the fragment's read
if not first:
    st.info(
        "No sweeps yet: press **New sweep** (the New run page's Sweep section) or use "
        "`eslab sweep CONFIG --grid OPTION=A,B --objective METRIC`."
    )
    st.stop()
refreshing = any(s.status is SweepStatus.ACTIVE for s in first)
st.fragment(listing)(refreshing)
