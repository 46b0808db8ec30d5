"""Sweeps: every sweep, newest first, with its progress against the budget and its best run so
far; each opens its Sweep page. While a sweep is active the table refreshes itself (a
fragment on a timer), and stops when none is."""

import streamlit as st

from app import actions, live
from app.views import MISSING
from jobs.store.status import SweepStatus

LIMIT = 100

st.title("Sweeps")
if st.button("New sweep", icon=":material/add:"):
    st.switch_page(actions.NEW_PAGE, query_params={"sweep": "1"})


def listing(refreshing: bool) -> None:
    """The table of the newest sweeps, as all its viewers share it (app/live.py)."""
    sweeps, table = live.sweeps_listing(LIMIT)
    if refreshing and not any(s.status is SweepStatus.ACTIVE for s in sweeps):
        st.rerun(scope="app")  # the last active sweep ended: redraw once without the timer
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
        + (f" · refreshing every {live.SWEEP_SECONDS:g} s" if refreshing else "")
    )


first, _ = live.sweeps_listing(LIMIT)  # the fragment's read, shared
if not first:
    st.info(
        "No sweeps yet: press **New sweep** (the New run page's Sweep section) or use "
        "`eslab sweep CONFIG --grid OPTION=A,B --objective METRIC`."
    )
    st.stop()
refreshing = any(s.status is SweepStatus.ACTIVE for s in first)
st.fragment(run_every=live.SWEEP_SECONDS if refreshing else None)(listing)(refreshing)
