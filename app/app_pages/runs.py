"""Runs: every run in the database, newest first."""

import streamlit as st

from app.state import get_store

st.title("ES Lab")
store = get_store()
count = store.count_runs()
st.success("ES Lab is running.")
if count == 0:
    st.info("No runs exist yet.")
    st.stop()
st.dataframe(
    [
        {
            "id": r.id,
            "name": r.name,
            "method": r.method,
            "status": r.status.value,
            "step": f"{r.step} / {r.total_steps or '?'}",
            "created": r.created_at,
        }
        for r in store.list_runs(limit=200)
    ],
    hide_index=True,
)
