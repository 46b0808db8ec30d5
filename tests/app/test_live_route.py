"""The live pages' route (app/live_route.py): the version of a run's page changes when a
step or an event is recorded, its status changes or its worker falls silent, and equals the
version the page draws from the same state (else every viewer would redraw for nothing, or
miss a change); the Runs page's changes when a run is added, a sweep's and the Sweeps page's
when one of the sweep's runs records a step or the sweep ends; one database read answers
every viewer for live.FRESH_SECONDS; and nothing is answered without a live ticket bound to
the page, a viewer's included, expired or forged ones refused with 401."""

from __future__ import annotations

import threading
import time

import pytest
from starlette.applications import Starlette
from starlette.testclient import TestClient

from app import auth, live, live_route, tickets, version_wait
from engine import metrics as mk
from engine.sink import StepReport
from jobs.store.status import RunStatus, SweepStatus
from jobs.store.store import Store
from tests.app.conftest import clear_streamlit_caches, make_config
from tests.app.sample_runs import add_sweep
from tests.app.test_upload_route import ticket_of


@pytest.fixture
def client(store, editor_and_viewer) -> TestClient:
    """The route over the seeded store (runs 1 and 2, running at step 2), logins on."""
    return TestClient(Starlette(routes=live_route.ROUTES))


def run_version(client: TestClient, run_id: int = 1) -> dict:
    """Run `run_id`'s version as a viewer's page asks for it, read afresh."""
    clear_streamlit_caches()  # what the route shares is up to live.FRESH_SECONDS old
    ticket = ticket_of("vi", tickets.LIVE, live_route.run_subject(run_id))
    reply = client.get(live_route.run_path(run_id), headers={"Authorization": f"Bearer {ticket}"})
    assert reply.status_code == 200, reply.text
    return reply.json()


def test_a_runs_version_changes_with_its_steps_events_status_and_silence(
    client, store, monkeypatch
):
    first = run_version(client)
    assert run_version(client) == first  # nothing changed
    store.record_step(1, StepReport(step=3, metrics={mk.reward_key(mk.TRAIN): 0.5}, wall_time=9))
    after_step = run_version(client)
    assert after_step["state"] != first["state"]
    store.add_event(1, "info", "engine ready")
    after_event = run_version(client)
    assert after_event["state"] != after_step["state"]
    store.heartbeat(1)
    assert run_version(client)["state"] == after_event["state"]  # a beat alone is no change
    monkeypatch.setattr(live, "HEARTBEAT_TIMEOUT", 0.5)
    time.sleep(1.0)
    silent = run_version(client)
    assert silent["state"] != after_event["state"]  # the page's "No heartbeat" warning
    store.heartbeat(1)
    assert run_version(client)["state"] == after_event["state"]
    store.set_status(1, RunStatus.SUCCEEDED)
    assert run_version(client)["state"] != after_event["state"]


def test_the_route_answers_the_version_the_page_draws(client, store):
    store.add_event(1, "info", "engine ready")
    clear_streamlit_caches()
    drawn = live.run_state(1).version  # what the Run page gives its watch
    assert run_version(client) == {"state": drawn.state}


def version_at(client: TestClient, path: str, subject: str) -> dict:
    """The version at `path` as an editor's page bound to `subject` asks for it, afresh."""
    clear_streamlit_caches()
    ticket = ticket_of("ed", tickets.LIVE, subject)
    reply = client.get(path, headers={"Authorization": f"Bearer {ticket}"})
    assert reply.status_code == 200, reply.text
    return reply.json()


def test_the_runs_pages_version_changes_when_a_run_is_added(client, store):
    first = version_at(client, live_route.RUNS_PATH, live_route.RUNS_SUBJECT)
    run = store.get_run(1)
    store.create_run(name="new-run", method="es", config=run.config, total_steps=5)
    assert version_at(client, live_route.RUNS_PATH, live_route.RUNS_SUBJECT) != first


def test_a_sweeps_versions_change_with_its_runs_and_its_end(client, store, dataset, tmp_path):
    sweep = add_sweep(store, make_config(dataset, tmp_path / "sweep-out"))
    pages = {
        "sweep": (live_route.sweep_path(sweep.id), live_route.sweep_subject(sweep.id)),
        "sweeps": (live_route.SWEEPS_PATH, live_route.SWEEPS_SUBJECT),
    }
    first = {name: version_at(client, *page)["state"] for name, page in pages.items()}
    [running] = [
        r for r in store.search_runs()[0] if r.sweep_id == sweep.id and r.status.value == "running"
    ]
    store.record_step(running.id, StepReport(step=2, metrics={mk.reward_key(mk.TRAIN): 1.0}))
    stepped = {name: version_at(client, *page)["state"] for name, page in pages.items()}
    assert all(stepped[name] != first[name] for name in pages), (first, stepped)
    store.set_sweep_status(sweep.id, SweepStatus.CANCELLED, expected=[SweepStatus.ACTIVE])
    ended = {name: version_at(client, *page)["state"] for name, page in pages.items()}
    assert all(ended[name] != stepped[name] for name in pages), (stepped, ended)
    other = ticket_of("ed", tickets.LIVE, live_route.sweep_subject(sweep.id + 1))
    reply = client.get(pages["sweep"][0], headers={"Authorization": f"Bearer {other}"})
    assert reply.status_code == 401


def test_one_database_read_answers_every_viewer_while_fresh(client, monkeypatch):
    reads: list[object] = []
    signs = Store.run_signs
    monkeypatch.setattr(
        Store, "run_signs", lambda self, ids=None: reads.append(ids) or signs(self, ids)
    )
    run_version(client)  # clears the shared read, then reads
    ticket = ticket_of("vi", tickets.LIVE, live_route.run_subject(1))
    for _ in range(20):
        reply = client.get(live_route.run_path(1), headers={"Authorization": f"Bearer {ticket}"})
        assert reply.status_code == 200
    assert len(reads) <= 2  # one, or two if FRESH_SECONDS passed meanwhile


def test_no_version_without_a_live_ticket_for_the_page(client):
    expired = tickets.mint(
        auth.signed_in(auth.load_users(auth.auth_path())["vi"]),
        tickets.LIVE,
        live_route.run_subject(1),
        now=time.time() - tickets.TICKET_TTL_S - 1,
    )
    body, _, signature = ticket_of("vi", tickets.LIVE, live_route.run_subject(1)).partition(".")
    refused = {
        "none": None,
        "forged": body + "." + "0" * len(signature),
        "expired": expired,
        "a download's": ticket_of("vi", tickets.DOWNLOAD, live_route.run_subject(1)),
        "of run 2": ticket_of("vi", tickets.LIVE, live_route.run_subject(2)),
        "of the Runs page": ticket_of("vi", tickets.LIVE, live_route.RUNS_SUBJECT),
    }
    for what, ticket in refused.items():
        headers = {} if ticket is None else {"Authorization": f"Bearer {ticket}"}
        reply = client.get(live_route.run_path(1), headers=headers)
        assert reply.status_code == 401, (what, reply.text)
        assert "state" not in reply.text
    assert (
        "expired"
        in client.get(live_route.run_path(1), headers={"Authorization": f"Bearer {expired}"}).text
    )


def test_without_logins_the_local_login_needs_a_ticket_too(store):
    client = TestClient(Starlette(routes=live_route.ROUTES))
    assert client.get(live_route.RUNS_PATH).status_code == 401
    ticket = tickets.mint(tickets.local_session(), tickets.LIVE, live_route.RUNS_SUBJECT)
    reply = client.get(live_route.RUNS_PATH, headers={"Authorization": f"Bearer {ticket}"})
    assert reply.status_code == 200 and "state" in reply.json()


# -- long polls: a request that names the version the page has is held until it changes ------


def held(client: TestClient, since: str, results: list[tuple[dict, float]]) -> threading.Thread:
    """A viewer's request for run 1's version `since`, in a thread: its answer and how long
    it took land in `results`."""
    ticket = ticket_of("vi", tickets.LIVE, live_route.run_subject(1))

    def ask() -> None:
        started = time.monotonic()
        reply = client.get(
            live_route.run_path(1),
            params={"since": since},
            headers={"Authorization": f"Bearer {ticket}"},
        )
        assert reply.status_code == 200, reply.text
        results.append((reply.json(), time.monotonic() - started))

    thread = threading.Thread(target=ask)
    thread.start()
    return thread


def test_a_held_request_is_answered_when_the_version_changes(client, store):
    first = run_version(client)
    results: list[tuple[dict, float]] = []
    with TestClient(Starlette(routes=live_route.ROUTES)) as holding:
        asking = held(holding, first["state"], results)
        time.sleep(2 * live.POLL_SECONDS + live.FRESH_SECONDS)
        assert results == []  # nothing changed: still held
        store.record_step(1, StepReport(step=3, metrics={mk.reward_key(mk.TRAIN): 0.5}))
        changed_at = time.monotonic()
        asking.join(timeout=10)
        answered_after = time.monotonic() - changed_at
    [(answer, _)] = results
    assert answer["state"] != first["state"]
    assert answered_after < live.POLL_SECONDS + live.FRESH_SECONDS + 1.0


def test_a_held_request_is_answered_at_its_time_limit_and_an_old_version_at_once(
    client, monkeypatch
):
    monkeypatch.setattr(version_wait, "HOLD_SECONDS", 1.5)
    first = run_version(client)
    results: list[tuple[dict, float]] = []
    with TestClient(Starlette(routes=live_route.ROUTES)) as holding:
        held(holding, first["state"], results).join(timeout=10)
        held(holding, "an older version", results).join(timeout=10)
    [(unchanged, waited), (newer, at_once)] = results
    assert unchanged == first and 1.5 <= waited < 5  # the page asks again
    assert newer == first and at_once < 1.0


def test_held_requests_share_one_read_of_the_version(client, monkeypatch):
    """Twenty viewers held on one run: the version is read (a thread each time, and a
    database query when the shared read is old) once per POLL_SECONDS for them all, not
    once per viewer."""
    monkeypatch.setattr(version_wait, "HOLD_SECONDS", 2.0)
    first = run_version(client)
    reads: list[int] = []
    read = live.run_version
    monkeypatch.setattr(live, "run_version", lambda run_id: reads.append(run_id) or read(run_id))
    results: list[tuple[dict, float]] = []
    with TestClient(Starlette(routes=live_route.ROUTES)) as holding:
        for viewer in [held(holding, first["state"], results) for _ in range(20)]:
            viewer.join(timeout=10)
    assert len(results) == 20 and all(answer == first for answer, _ in results)
    assert len(reads) <= 2.0 / live.POLL_SECONDS + 2, len(reads)


def test_a_held_request_needs_a_ticket_too(client):
    reply = client.get(live_route.run_path(1), params={"since": "x"})
    assert reply.status_code == 401 and "state" not in reply.text
