"""The whole product as a user meets it: `eslab serve` (Ray head, scheduler, dashboard) on a
temporary database with logins, driven in Debian's Chromium by Playwright. An editor logs
in, picks the es-conciseness preset in the New run form, shrinks it to a tiny real run
(vLLM on the CPU, the default model) and queues it; the run page goes queued -> running ->
succeeded while its charts fill in, without a page reload; the copied URL opens the same
view in a fresh browser; a clone makes a second run; Compare shows both; a viewer gets no
action buttons. Screenshots of every page go to $ESLAB_TEST_OUTPUT (or the test's tmp).

Two real runs, each starting a vLLM engine (about 30 s on a quiet 2-core CPU): minutes."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from app import auth
from app.forms import label
from engine.config import config_fields
from jobs.phases import STARTING_ENGINE
from jobs.store.migrate import upgrade
from jobs.store.status import RunStatus
from jobs.store.store import Store
from tests.app.browser import WAIT_MS, playwright_or_skip, shots_folder
from tests.app.serving import eslab_serve, serve_env

pytestmark = pytest.mark.heavy
playwright_api = playwright_or_skip()

PASSWORDS = {"ed": "editor-pass", "vi": "viewer-pass"}
RUN_DEADLINE_S = 420  # one tiny run, engine start included, on a busy 2-core CPU
VIEWPORT = {"width": 1400, "height": 1800}  # Streamlit scrolls inside: a tall shot


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Iterator[tuple[str, str, Path]]:
    """(dashboard URL, database URL, tmp folder) of an `eslab serve` with logins."""
    tmp = tmp_path_factory.mktemp("e2e")
    db_url = f"sqlite:///{tmp / 'eslab.db'}"
    upgrade(db_url)
    users = tmp / "users.yaml"
    for name, role in (("ed", "editor"), ("vi", "viewer")):
        auth.add_user(users, name, role, PASSWORDS[name])
    env = serve_env(db_url, ESLAB_AUTH_FILE=str(users))
    with eslab_serve(env, tmp / "serve.log") as base:
        yield base, db_url, tmp


def login(browser, url: str, name: str):
    """A fresh browser context (a collaborator) opening `url` and logging in as `name`."""
    page = browser.new_context(viewport=VIEWPORT).new_page()
    page.goto(url)
    log_in(page, name)
    return page


def log_in(page, name: str) -> None:
    page.get_by_label("User name", exact=True).fill(name)
    page.get_by_label("Password", exact=True).fill(PASSWORDS[name])
    page.get_by_role("button", name="Log in").click()
    page.get_by_text(f"Signed in as {name}").wait_for(timeout=WAIT_MS)


def settle(page) -> None:
    """Wait for the script rerun a widget change started to finish."""
    page.wait_for_timeout(300)
    page.locator("[data-testid='stStatusWidget']").wait_for(state="detached", timeout=WAIT_MS)


def field(name: str) -> str:
    """The New run form's label of option `name` (what a person reads, and the widget's
    accessible name)."""
    return next(label(spec) for spec in config_fields() if spec.name == name)


def fill(page, label: str, value: str) -> None:
    box = page.get_by_label(label, exact=True)
    if not box.is_visible():  # in a group a rerun drew collapsed
        expand_all(page)
    box.fill(value)
    box.press("Enter")
    settle(page)


def choose(page, label: str, option: str) -> None:
    page.get_by_role("combobox", name=label, exact=True).click()
    page.get_by_role("option", name=option, exact=True).click()
    settle(page)


def expand_all(page) -> None:
    page.locator("[data-testid='stExpander']").last.wait_for(timeout=WAIT_MS)
    closed = page.locator("[data-testid='stExpander'] details:not([open]) summary")
    while closed.count():  # the list shrinks as each one opens
        closed.first.click()


def metric(page, label: str) -> str:
    card = page.locator("[data-testid='stMetric']").filter(has_text=label).first
    return card.locator("[data-testid='stMetricValue']").inner_text().strip()


def charts_on(page) -> int:
    return page.locator("[data-testid='stVegaLiteChart']").count()


def watch_run(page, deadline_s: float) -> list[tuple[str, int]]:
    """(status, charts drawn) each time either changed on the Run page, until the run
    ended: the page is only watched, never reloaded."""
    seen: list[tuple[str, int]] = []
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        now = (metric(page, "Status"), charts_on(page))
        if not seen or seen[-1] != now:
            seen.append(now)
        if now[0] != STARTING_ENGINE and RunStatus(now[0]).is_terminal():
            return seen
        time.sleep(0.5)
    pytest.fail(f"the run did not end within {deadline_s:.0f} s; seen: {seen}")


def test_launch_watch_share_compare_and_roles(served, browser, tmp_path):
    base, db_url, tmp = served
    shots = shots_folder(tmp_path)

    # An editor fills the New run form: the preset, then a tiny real run.
    page = login(browser, f"{base}/new", "ed")
    page.evaluate("window.eslabMarker = 'no reload'")
    choose(page, "Preset", "es-conciseness")
    expand_all(page)
    choose(page, field("save_strategy"), "no")  # the final model is saved all the same
    for name, value in (
        ("population_size", "2"),
        ("data_batch_size", "2"),
        ("max_steps", "2"),
        ("max_tokens", "4"),  # a decode step is ~0.17 s whatever the batch: few of them
        ("eval_steps", "2"),
        ("max_model_len", "1024"),
        ("max_num_seqs", "16"),
        ("output_dir", str(tmp / "run-a")),
        ("run_name", "e2e-a"),
    ):
        fill(page, field(name), value)
    page.screenshot(path=shots / "e2e-new-run.png", full_page=True)
    page.get_by_role("button", name="Queue run").click()

    # Its page: queued -> running -> succeeded, charts filling in, all without a reload.
    page.get_by_role("heading", name="e2e-a").wait_for(timeout=WAIT_MS)
    assert "/run?run=1" in page.url
    page.get_by_role("button", name="Cancel").wait_for(timeout=WAIT_MS)  # an editor may
    seen = watch_run(page, RUN_DEADLINE_S)
    print("run page:", seen)
    statuses = list(dict.fromkeys(status for status, _ in seen))
    # the engine's start shows as its own phase, live (the page is never reloaded)
    assert statuses == ["queued", STARTING_ENGINE, "running", "succeeded"], (
        seen,
        (tmp / "serve.log").read_text()[-3000:],
    )
    assert seen[0][1] == 0  # no chart before the first step ...
    page.get_by_text("population fitness per step").first.wait_for(timeout=WAIT_MS)
    assert charts_on(page) >= 7  # ... then population, rewards, schedules, phases
    assert metric(page, "Step") == "2 / 2"
    assert page.evaluate("window.eslabMarker") == "no reload"
    store = Store(db_url)
    try:
        config = store.get_run(1).config
        assert (config["population_size"], config["max_steps"], config["max_tokens"]) == (2, 2, 4)
        assert len(store.metric_series(1, "train/reward/mean")) == 2
    finally:
        store.close()
    page.screenshot(path=shots / "e2e-run-succeeded.png", full_page=True)

    # The copied URL, opened by a collaborator, shows the same run and tab.
    page.get_by_role("tab", name="Samples").click()
    settle(page)
    assert "tab=Samples" in page.url
    shared = login(browser, page.url, "ed")
    shared.get_by_role("heading", name="e2e-a").wait_for(timeout=WAIT_MS)
    shared.get_by_role("tab", name="Samples", selected=True).wait_for(timeout=WAIT_MS)
    shared.get_by_text("population fitness per step").first.wait_for(timeout=WAIT_MS)
    shared.get_by_text("samples at step 2").wait_for(timeout=WAIT_MS)
    shared.locator("[data-testid='stCode']").first.wait_for(timeout=WAIT_MS)  # a sample's card
    shared.screenshot(path=shots / "e2e-shared-url.png", full_page=True)

    # A second run: a clone of the first, queued from the prefilled form.
    page.get_by_role("button", name="Clone").click()
    page.get_by_text("Cloning run 1").wait_for(timeout=WAIT_MS)
    settle(page)
    expand_all(page)
    page.locator(f"input[aria-label='{field('run_name')}'][value^='e2e-a-clone-']").wait_for(
        state="attached", timeout=WAIT_MS
    )  # prefilled from run 1
    fill(page, field("run_name"), "e2e-b")
    page.get_by_role("button", name="Queue run").click()
    page.get_by_role("heading", name="e2e-b").wait_for(timeout=WAIT_MS)
    # Meanwhile the Runs page, left open, redraws itself until no run is live.
    runs = login(browser, f"{base}/", "ed")
    refreshing = runs.get_by_text("redrawn when a run changes")
    refreshing.wait_for(timeout=WAIT_MS)
    runs.evaluate("window.eslabMarker = 'no reload'")
    assert watch_run(page, RUN_DEADLINE_S)[-1][0] == "succeeded"
    assert page.evaluate("window.eslabMarker") == "no reload"
    refreshing.wait_for(state="detached", timeout=WAIT_MS)
    runs.get_by_text("2 runs · page 1 of 1").wait_for(timeout=WAIT_MS)
    assert runs.evaluate("window.eslabMarker") == "no reload"
    runs.screenshot(path=shots / "e2e-runs.png", full_page=True)

    page.goto(f"{base}/compare?runs=1,2")  # a new session: log in again
    log_in(page, "ed")
    page.get_by_text("Only differences").wait_for(timeout=WAIT_MS)
    page.locator("[data-testid='stVegaLiteChart']").first.wait_for(timeout=WAIT_MS)
    assert "e2e-b" in page.inner_text("body")
    page.screenshot(path=shots / "e2e-compare.png", full_page=True)

    # A viewer sees the runs but no action, and cannot queue one.
    viewer = login(browser, f"{base}/run?run=1", "vi")
    viewer.get_by_role("heading", name="e2e-a").wait_for(timeout=WAIT_MS)
    viewer.get_by_text("You are a viewer").wait_for(timeout=WAIT_MS)
    for name in ("Cancel", "Clone", "Resume"):
        assert viewer.get_by_role("button", name=name).count() == 0
    viewer.screenshot(path=shots / "e2e-viewer-run.png", full_page=True)
    viewer.get_by_role("link", name="Runs", exact=True).click()
    viewer.get_by_text("Viewers cannot clone").wait_for(timeout=WAIT_MS)
    assert viewer.get_by_role("button", name="Delete").count() == 0
    viewer.screenshot(path=shots / "e2e-viewer-runs.png", full_page=True)
    viewer.get_by_role("link", name="New run", exact=True).click()
    assert viewer.get_by_role("button", name="Queue run").is_disabled()
