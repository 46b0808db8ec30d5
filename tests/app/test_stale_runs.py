"""Without `eslab serve`, nothing ends a run whose worker was killed: the Runs and Run pages
mark a live run whose heartbeat is older than ESLAB_HEARTBEAT_TIMEOUT_S as stale."""

from __future__ import annotations

import time

import streamlit as st
from streamlit.testing.v1 import AppTest

from jobs.store.store import Store
from tests.app.test_pages import MAIN, TIMEOUT, page


def test_a_silent_run_is_shown_stale(seeded_url, monkeypatch):
    monkeypatch.setenv("ESLAB_DATABASE_URL", seeded_url)
    monkeypatch.setenv("ESLAB_HEARTBEAT_TIMEOUT_S", "2")
    st.cache_resource.clear()
    st.cache_data.clear()
    store = Store(seeded_url)
    try:
        time.sleep(2.2)
        alpha = store.search_runs(text="alpha")[0][0]
        beta = store.search_runs(text="beta")[0][0]
        store.beat(alpha.id)  # alpha's worker lives; beta's went silent

        at = AppTest.from_file(MAIN, default_timeout=TIMEOUT).run()
        assert not at.exception
        table = at.dataframe[0].value
        statuses = dict(zip(table["name"], table["status"], strict=True))
        assert statuses["alpha-run"] == "running"
        assert statuses["beta-run"].startswith("running (stale: no heartbeat for ")

        store.beat(alpha.id)
        assert not page("app_pages/run.py", run=str(alpha.id)).warning
        warnings = [w.value for w in page("app_pages/run.py", run=str(beta.id)).warning]
        assert any(w.startswith("No heartbeat from this run's worker for ") for w in warnings)
    finally:
        store.close()
        st.cache_resource.clear()
