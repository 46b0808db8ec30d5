"""Samples (`?run=ID&split=...&step=...`): the sample inspector over one run's completions,
by split and step (app/samples_view.py)."""

import streamlit as st

from app.samples_view import Scope, sample_inspector
from app.state import get_store
from app.views import id_param, label, set_param, show_error
from jobs.store.errors import StoreError

st.title("Samples")
store = get_store()
runs = store.list_runs(limit=200)
if not runs:
    st.info("No runs exist yet.")
    st.stop()
ids = [r.id for r in runs]
wanted = id_param("run")
if wanted is not None and wanted not in ids:
    try:
        runs.insert(0, store.get_run(wanted))
        ids.insert(0, wanted)
    except StoreError as exc:
        show_error(exc)
        wanted = None
by_id = {r.id: r for r in runs}
chosen = st.selectbox(
    "Run",
    ids,
    index=ids.index(wanted) if wanted in ids else 0,
    format_func=lambda i: label(by_id[i]),
)
set_param("run", str(chosen))
sample_inspector(store, by_id[chosen], Scope("samples"))
