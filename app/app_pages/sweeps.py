"""Sweeps: every sweep, newest first, with its progress against the budget and its best run so
far; each opens its Sweep page. While a sweep is active the table refreshes itself (a
fragment on a timer), and stops when none is."""

import pandas as pd
import streamlit as st

from app import actions, sweep_view
from app.state import get_store
from app.views import MISSING
from jobs.store.records import SweepRecord
from jobs.store.status import SweepStatus
from jobs.sweeps.driver import sweep_table
from jobs.sweeps.spec import SweepSpec

LIMIT = 100
REFRESH_SECONDS = 5

st.title("Sweeps")
store = get_store()
if st.button("New sweep", icon=":material/add:"):
    st.switch_page(actions.NEW_PAGE, query_params={"sweep": "1"})


def row(sweep: SweepRecord) -> dict:
    spec = SweepSpec.from_dict(sweep.spec)
    table = sweep_table(store, sweep.id)
    done = sweep_view.progress(table, spec.budget)
    top = sweep_view.best(table)
    return {
        "id": sweep.id,
        "name": sweep.name,
        "status": sweep.status.value,
        "method": spec.method,
        "options": ", ".join(p.name for p in spec.parameters),
        "objective": f"{spec.objective.metric} ({spec.objective.mode})",
        "progress": done.fraction,
        "runs done": f"{done.done} / {done.budget}",
        "live": done.queued + done.running,
        "best": None if top is None else top["objective"],
        "best run": None if top is None else f"/run?run={top['run_id']}",
        "created": sweep.created_at,
        "open": f"/sweep?sweep={sweep.id}",
    }


def listing(refreshing: bool) -> None:
    sweeps = store.list_sweeps(limit=LIMIT)
    if refreshing and not any(s.status is SweepStatus.ACTIVE for s in sweeps):
        st.rerun(scope="app")  # the last active sweep ended: redraw once without the timer
    st.dataframe(
        pd.DataFrame([row(s) for s in sweeps]),
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
        + (f" · refreshing every {REFRESH_SECONDS} s" if refreshing else "")
    )


first = store.list_sweeps(limit=LIMIT)
if not first:
    st.info(
        "No sweeps yet: press **New sweep** (the New run page's Sweep section) or use "
        "`eslab sweep CONFIG --grid OPTION=A,B --objective METRIC`."
    )
    st.stop()
refreshing = any(s.status is SweepStatus.ACTIVE for s in first)
st.fragment(run_every=REFRESH_SECONDS if refreshing else None)(listing)(refreshing)
