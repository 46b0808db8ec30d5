"""What the Run and Runs pages say of a run's state: "starting engine" with the time it has
taken (the Runs page) or since when (the Run page, which no clock redraws) while the
worker's engine starts (the events jobs.worker writes), and a failed run's
error in words first, with its traceback or the end of its log behind an expander."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import text
from streamlit.testing.v1 import AppTest

from app.views import error_parts, inert, utc_time
from engine.backends.pool import engine_place
from jobs import phases
from jobs.outcome import format_traceback, with_log_tail
from jobs.store.rows import utcnow
from jobs.store.status import RunStatus
from tests.app.conftest import clear_streamlit_caches
from tests.app.test_pages import MAIN, TIMEOUT, page


def starting_run(store, seconds_ago: float):
    """A running run at step 0 whose worker noted the engine's start `seconds_ago`."""
    run = store.create_run(
        name="fresh-run", method="es", config={}, total_steps=5, status=RunStatus.RUNNING
    )
    store.add_event(run.id, "info", phases.STARTING_ENGINE)
    with store.engine.begin() as c:  # as if the event had been written back then
        c.execute(
            text("UPDATE events SET created_at = :t WHERE run_id = :r"),
            {"t": utcnow() - timedelta(seconds=seconds_ago), "r": run.id},
        )
    return run


def flat(node) -> list:
    """Every element of an AppTest tree, in page order."""
    children = getattr(node, "children", None)
    if not children:
        return [node]
    return [leaf for child in children.values() for leaf in flat(child)]


def test_a_run_whose_engine_starts_says_so_with_the_time_taken(store):
    run = starting_run(store, seconds_ago=42)
    at = page("app_pages/run.py", run=str(run.id))
    assert not at.exception
    assert at.metric[0].value == "starting engine"
    [started] = [e.created_at for e in store.events(run.id)]
    assert f"Starting engine since {utc_time(started)}: " in at.info[0].value

    table = AppTest.from_file(MAIN, default_timeout=TIMEOUT).run().dataframe[0].value
    status = dict(zip(table["name"], table["status"], strict=True))
    assert status["fresh-run"].startswith("running: starting engine (4")
    assert status["alpha-run"] == "running"  # its steps run: no phase

    store.add_event(run.id, "info", phases.engine_started(31.2))
    clear_streamlit_caches()  # what the pages share is up to live.FRESH_SECONDS old
    at = page("app_pages/run.py", run=str(run.id))
    assert at.metric[0].value == "running"
    assert not [i for i in at.info if "Starting engine" in i.value]


def test_a_failed_run_shows_its_error_first_and_the_traceback_on_demand(store):
    run = store.search_runs(text="alpha")[0][0]
    try:
        try:
            raise KeyError("prompt")
        except KeyError as exc:
            raise ValueError("the reward function engine.rewards.x failed\non sample 3") from exc
    except ValueError as exc:
        traceback = format_traceback(exc)
    store.finish_run(run.id, RunStatus.FAILED, error=traceback)
    at = page("app_pages/run.py", run=str(run.id))
    assert not at.exception
    kinds = [type(e).__name__ for e in flat(at.main)]
    assert kinds.index("Error") < kinds.index("Metric")
    shown = at.error[0].value.replace("\\", "")
    assert shown == "ValueError: the reward function engine.rewards.x failed  \non sample 3"
    assert [e.label for e in at.expander] == ["Traceback"]
    assert "KeyError" in at.code[0].value


def test_a_run_the_scheduler_failed_names_the_reason_and_the_logs_last_error():
    log = (
        "2026-11-27 INFO jobs.worker: run 3 resumes\n"
        "Traceback (most recent call last):\n"
        '  File "jobs/worker.py", line 1, in <module>\n'
        "    import missing\n"
        "ModuleNotFoundError: No module named 'missing'\n"
    )
    reason = "the worker's Ray job uuid-2 FAILED before the run ended"
    summary, details, title = error_parts(with_log_tail(reason, log))
    assert summary == (
        f"{reason}.\nThe last error in its log: ModuleNotFoundError: No module named 'missing'"
    )
    assert details == log.strip() and title == "The end of the worker's log"
    assert error_parts("no heartbeat for 90 s") == ("no heartbeat for 90 s", None, "")


def test_the_run_page_says_where_its_engines_computed(store):
    run = starting_run(store, seconds_ago=5)
    at = page("app_pages/run.py", run=str(run.id))
    assert not [c for c in at.caption if "Engine" in c.value]  # not started yet

    # two Ray nodes of one machine: one host name, told apart by their node ids
    places = [
        engine_place(
            {"host": "box", "device": "cpu", "device_name": "Xeon", "node_id": node, "node_ip": ip}
        )
        for node, ip in (("3f2a1b9c" * 7, "10.0.0.5"), ("77e0c4d1" * 7, "10.0.0.5"))
    ]
    store.add_event(run.id, "info", phases.engine_started(31.2, places))
    clear_streamlit_caches()  # what the pages share is up to live.FRESH_SECONDS old
    at = page("app_pages/run.py", run=str(run.id))
    shown = [c.value for c in at.caption if "engines:" in c.value]
    assert shown == ["2 engines: " + " · ".join(inert(p) for p in places)]
    assert "Ray node 3f2a1b9c" in shown[0] and "Ray node 77e0c4d1" in shown[0]


def test_engine_places_read_back_what_the_worker_wrote():
    from types import SimpleNamespace

    def event(message: str) -> SimpleNamespace:
        return SimpleNamespace(message=message)

    one = ["node-1/cpu (Intel(R) Xeon(R) Processor)"]
    assert phases.engine_places([]) == []
    assert phases.engine_places([event(phases.engine_started(3.0))]) == []
    assert phases.engine_places([event(phases.engine_started(3.0, one))]) == one
    restarted = [event(phases.engine_started(3.0, one)), event(phases.STARTING_ENGINE)]
    assert phases.engine_places(restarted) == one  # the latest start that finished
