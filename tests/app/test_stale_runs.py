"""Without `eslab serve`, nothing ends a run whose worker was killed: the Runs and Run pages
and `eslab runs` mark a live run whose heartbeat is older than ESLAB_HEARTBEAT_TIMEOUT_S, in
the database's time, as stale."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import streamlit as st
from streamlit.testing.v1 import AppTest

from app.cli import main
from app.views import utc_time
from jobs.store import models
from jobs.store.store import Store
from tests.app.test_pages import MAIN, TIMEOUT, page


def test_a_silent_run_is_shown_stale(seeded_url, monkeypatch):
    monkeypatch.setenv("ESLAB_DATABASE_URL", seeded_url)
    monkeypatch.setenv("ESLAB_HEARTBEAT_TIMEOUT_S", "60")  # far above a loaded page's time
    st.cache_resource.clear()
    st.cache_data.clear()
    store = Store(seeded_url)
    try:
        alpha = store.search_runs(text="alpha")[0][0]
        beta = store.search_runs(text="beta")[0][0]
        store.beat(alpha.id)  # alpha's worker lives; beta's went silent ten minutes ago
        with store._session() as s:
            silent_since = store.database_now() - timedelta(minutes=10)
            s.query(models.Run).filter_by(id=beta.id).update({"heartbeat_at": silent_since})

        at = AppTest.from_file(MAIN, default_timeout=TIMEOUT).run()
        assert not at.exception
        table = at.dataframe[0].value
        statuses = dict(zip(table["name"], table["status"], strict=True))
        assert statuses["alpha-run"] == "running"
        assert statuses["beta-run"].startswith("running (stale: no heartbeat for ")

        store.beat(alpha.id)
        assert not page("app_pages/run.py", run=str(alpha.id)).warning
        warnings = [w.value for w in page("app_pages/run.py", run=str(beta.id)).warning]
        since = f"No heartbeat from this run's worker since {utc_time(silent_since)}: "
        assert any(w.startswith(since) for w in warnings), warnings
    finally:
        store.close()
        st.cache_resource.clear()


@pytest.mark.parametrize("database_ahead", [True, False])
def test_staleness_is_judged_by_database_time(seeded_url, monkeypatch, capsys, database_ahead):
    """A database whose clock is an hour off this host's: a heartbeat it wrote a second ago
    (in its time) is fresh, one it wrote an hour ago is stale, whatever this host's clock
    says, on the Runs page, the Run page and in `eslab runs` alike."""
    monkeypatch.setenv("ESLAB_DATABASE_URL", seeded_url)
    monkeypatch.setenv("ESLAB_HEARTBEAT_TIMEOUT_S", "60")
    st.cache_resource.clear()
    st.cache_data.clear()
    store = Store(seeded_url)
    try:
        host_now = datetime.now(UTC)
        # Ahead: it beat at the host's now, and it is an hour later in the database. Behind:
        # it beat an hour ago by the host's clock, a second ago in the database's.
        beat_at = host_now if database_ahead else host_now - timedelta(hours=1)
        database_time = beat_at + (timedelta(hours=1) if database_ahead else timedelta(seconds=1))
        with store._session() as s:
            s.query(models.Run).update({"heartbeat_at": beat_at})
        monkeypatch.setattr(Store, "database_now", lambda self: database_time)

        at = AppTest.from_file(MAIN, default_timeout=TIMEOUT).run()
        assert not at.exception
        [status] = at.dataframe[0].value.query("name == 'alpha-run'")["status"]
        warnings = [w.value for w in page("app_pages/run.py", run="1").warning]
        assert main(["runs"]) == 0
        [line] = [x for x in capsys.readouterr().out.splitlines() if "alpha-run" in x]
        stale = "running (stale: no heartbeat for 60 min)"
        if database_ahead:
            assert status == stale and stale in line
            since = f"No heartbeat from this run's worker since {utc_time(beat_at)}: "
            assert any(w.startswith(since) for w in warnings), warnings
        else:
            assert status == "running" and "stale" not in line and not warnings
    finally:
        store.close()
        st.cache_resource.clear()
