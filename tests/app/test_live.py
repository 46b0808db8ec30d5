"""The live pages' shared reads (app/live.py): one database read serves every viewer within
FRESH_SECONDS, an action's change shows at once, and a run's charts are built once per step
with their data already in the form Streamlit sends. A live Run page carries its version
watches (app/version_watch.py; AppTest runs no script, so what they are given is checked
here, what they do in tests/app/test_browser.py), a finished one none."""

from __future__ import annotations

import json
import time
from pathlib import Path

from streamlit.testing.v1 import AppTest

from app import live, live_route, tickets, ticking_metric, version_watch
from engine import metrics as mk
from engine.sink import StepReport
from jobs.store.status import RunStatus
from jobs.store.store import Store

MAIN = str(Path(__file__).resolve().parents[2] / "app" / "main.py")


def counting_reads(monkeypatch) -> list[int]:
    reads: list[int] = []
    get_run = Store.get_run

    def counted(self, run):
        reads.append(run)
        return get_run(self, run)

    monkeypatch.setattr(Store, "get_run", counted)
    return reads


def test_a_runs_state_is_read_once_for_all_viewers_until_it_is_old(store, monkeypatch):
    reads = counting_reads(monkeypatch)
    first = live.run_state(1)
    assert live.run_state(1) is first  # a second viewer within FRESH_SECONDS
    assert reads == [1]
    store.set_status(1, RunStatus.CANCELLED)
    live.forget([1])  # what an action does after changing the run
    assert live.run_state(1).run.status is RunStatus.CANCELLED
    time.sleep(live.FRESH_SECONDS + 0.1)
    live.run_state(1)
    assert reads == [1, 1, 1]


def test_charts_are_built_once_per_step_with_their_data_as_arrow(store, monkeypatch):
    run = store.get_run(1)
    builds: list[int] = []
    population = live.run_charts.population
    monkeypatch.setattr(
        live.run_charts, "population", lambda s, r: builds.append(r.step) or population(s, r)
    )
    fitness, figures = live.run_charts_at(1, run.step, run.status.value, "step", 0.0, run)
    again = live.run_charts_at(1, run.step, run.status.value, "step", 0.0, run)
    assert again[0] is fitness and builds == [run.step]
    assert figures and all(
        isinstance(data, bytes)
        for spec in (fitness, *figures)
        for data in spec["datasets"].values()
    )
    store.record_step(
        1, StepReport(step=run.step + 1, metrics={mk.reward_key(mk.TRAIN): 0.5}, wall_time=9e3)
    )
    newer = store.get_run(1)
    live.run_charts_at(1, newer.step, newer.status.value, "step", 0.0, newer)
    assert builds == [run.step, run.step + 1]


def test_the_run_page_draws_the_shared_charts(store):
    at = AppTest.from_file(MAIN, default_timeout=60)
    at.query_params["run"] = "1"
    at.switch_page("app_pages/run.py")
    at.run()
    assert not at.exception
    charts = at.get("vega_lite_chart")
    assert len(charts) >= 2  # the population and at least one metric
    assert all(chart.proto.datasets for chart in charts)


def components_of(run_id: int, name: str) -> list[dict]:
    """What the Run page of `run_id` gives its components `name`."""
    at = AppTest.from_file(MAIN, default_timeout=60)
    at.query_params["run"] = str(run_id)
    at.switch_page("app_pages/run.py")
    at.run()
    assert not at.exception
    return [
        json.loads(c.proto.json) for c in at.get("bidi_component") if c.proto.component_name == name
    ]


def watches_of(run_id: int) -> list[dict]:
    return components_of(run_id, version_watch.COMPONENT)


def test_a_live_run_page_watches_its_version_and_a_finished_one_does_not(store):
    status, charts = watches_of(1)
    version = live.run_version(1)
    assert status["state"] == charts["state"] == version.state
    assert status["url"].endswith(live_route.run_path(1))
    tickets.verify(status["ticket"], tickets.LIVE, live_route.run_subject(1))
    store.set_status(1, RunStatus.SUCCEEDED)
    live.forget([1])
    assert watches_of(1) == []


def test_a_live_runs_elapsed_time_counts_in_the_browser_from_the_databases_time(store):
    """The status's "Elapsed" goes on counting without a rerun (what the count looks like,
    tests/app/test_browser.py); it starts from the run's time as of the database's clock,
    which its start was written in. A finished run's stands still."""
    run = store.get_run(1)
    before = (store.database_now() - run.started_at).total_seconds()
    [ticker] = components_of(1, ticking_metric.COMPONENT)
    after = (store.database_now() - run.started_at).total_seconds()
    assert before - live.FRESH_SECONDS <= ticker["seconds"] <= after
    assert ticker["container"] == "st-key-elapsed"
    store.set_status(1, RunStatus.SUCCEEDED)
    live.forget([1])
    assert components_of(1, ticking_metric.COMPONENT) == []
