"""The dashboard in Debian's Chromium (never a downloaded browser), driven by Playwright,
against `streamlit run app/server.py` (as `eslab serve` runs it: the routes beside the pages)
on a seeded database: the Runs page and a Run page render, a live Run page shows a new step
without a reload, its status first, and asks for no rerun while nothing changes (its elapsed
time counts in the browser), a run page's URL opens the
same view, the sample inspector finds an LBES run's kept and dropped samples, shows a long
completion whole and diffs a completion across steps, and a sweep's page ranks its runs,
draws its chart and opens its best run. Screenshots go to the test's tmp folder (or
$ESLAB_TEST_OUTPUT)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from streamlit.proto.BackMsg_pb2 import BackMsg

from engine import metrics as mk
from engine.sink import StepReport
from jobs.store.status import RunStatus
from jobs.store.store import Store
from tests.app.browser import WAIT_MS, free_port, playwright_or_skip, shots_folder
from tests.app.sample_runs import CHANGED, END, LONG, add_lbes_samples, add_sweep

APP = Path(__file__).resolve().parents[2] / "app" / "server.py"
NEW_STEP_MS = 20_000
"""How soon a live Run page shows a new step: a second's poll and a fragment's rerun, with
room for a loaded machine (WAIT_MS is for whole pages)."""
playwright_api = playwright_or_skip()


@pytest.fixture(scope="module")
def seeded_url(tmp_path_factory) -> str:
    """One seeded database and one server for this module (starting one costs seconds);
    the live-refresh test, which changes run 1, runs last."""
    from tests.app.conftest import make_config, seed, write_task

    folder = tmp_path_factory.mktemp("browser")
    dataset = write_task(folder)
    url = seed(folder, dataset)
    store = Store(url)
    try:
        add_lbes_samples(store, 2)  # beta-run: kept and dropped samples for the inspector
        add_sweep(store, make_config(dataset, folder / "sweep"))  # sweep 1: runs 3 to 8
    finally:
        store.close()
    return url


@pytest.fixture(scope="module")
def server(seeded_url, tmp_path_factory) -> Iterator[str]:
    tmp_path = tmp_path_factory.mktemp("server")
    port = free_port()
    log = open(tmp_path / "streamlit.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "streamlit",
            "run",
            str(APP),
            "--server.address",
            "127.0.0.1",
            "--server.port",
            str(port),
            "--server.headless",
            "true",
            "--browser.gatherUsageStats",
            "false",
        ],
        env={
            **os.environ,
            "ESLAB_DATABASE_URL": seeded_url,
            # The seeded runs are "running" with no worker: under the default timeout (120 s)
            # their workers turn silent while the module runs, and a live page rightly redraws
            # then, in the middle of a test that counts its redraws (test_stale_runs has that)
            "ESLAB_HEARTBEAT_TIMEOUT_S": "86400",
        },
        stdout=log,
        stderr=log,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{base}/_stcore/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(
                    "streamlit did not start: " + (tmp_path / "streamlit.log").read_text()[-2000:]
                )
            time.sleep(0.3)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


@pytest.fixture
def shots(tmp_path) -> Path:
    return shots_folder(tmp_path)


def test_runs_and_run_pages_in_chromium(server, browser, shots):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(f"{server}/")
    page.get_by_text("8 runs · page 1 of 1", exact=False).wait_for(timeout=WAIT_MS)
    page.locator("[data-testid='stDataFrame'] canvas").first.wait_for(timeout=WAIT_MS)
    page.get_by_role("button", name="Compare").wait_for(timeout=WAIT_MS)
    page.screenshot(path=shots / "runs.png", full_page=True)

    page.goto(f"{server}/run?run=1")
    page.get_by_role("heading", name="alpha-run").wait_for(timeout=WAIT_MS)
    page.get_by_text("population fitness per step").first.wait_for(timeout=WAIT_MS)
    page.screenshot(path=shots / "run.png", full_page=True)
    assert "2 / 5" in page.inner_text("body")

    fresh = browser.new_page()  # a collaborator opening the copied link
    fresh.goto(f"{server}/run?run=2&x=wall+time+%28min%29")
    fresh.get_by_role("heading", name="beta-run").wait_for(timeout=WAIT_MS)
    assert fresh.get_by_role("radio", name="wall time (min)").is_checked()


@pytest.mark.parametrize(
    "path, text",
    [
        ("/new", "Queue run"),
        ("/new?sweep=1", "Launch sweep"),
        ("/sweeps", "noise-sweep"),
        ("/compare?runs=1,2", "Only differences"),
        ("/samples?run=2&split=eval", "beta-run says 4"),
    ],
)
def test_other_pages_in_chromium(server, browser, shots, path, text):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(f"{server}{path}")
    # table cells are in the DOM for accessibility but hidden under the canvas
    page.get_by_text(text).first.wait_for(state="attached", timeout=WAIT_MS)
    page.screenshot(path=shots / f"{re.sub(r'[^a-z0-9]+', '-', path.strip('/'))}.png")


def test_run_page_tab_comes_from_the_url(server, browser, shots):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(f"{server}/run?run=2&tab=LBES")
    page.get_by_role("tab", name="LBES", selected=True).wait_for(timeout=WAIT_MS)
    page.get_by_text("Members at step 2").wait_for(timeout=WAIT_MS)  # visible: tab is open
    page.get_by_role("tab", name="LBES").scroll_into_view_if_needed()
    page.screenshot(path=shots / "run-lbes.png")


def test_the_sample_inspector_in_chromium(server, browser, shots):
    """An LBES run's dropped and kept samples found by filter, a long completion read in
    full (wrapped, nothing scrolled away or cut off), and a completion against the same
    prompt's at the step before, the changes highlighted."""
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(f"{server}/samples?run=2")
    page.get_by_text("7 of 7 samples at step 2").wait_for(timeout=WAIT_MS)
    page.locator("[data-testid='stSelectbox']").filter(has_text="Kept or dropped").click()
    by_variance = "dropped by prompt-variance filter (top_k_prompt_reward_var)"
    page.get_by_role("option", name=by_variance).click()
    page.get_by_text("3 of 7 samples at step 2").wait_for(timeout=WAIT_MS)
    expect = playwright_api.expect  # retries until the rerun has replaced the old cards
    expect(page).to_have_url(re.compile("outcome=top_k_prompt_reward_var"), timeout=WAIT_MS)
    cards = page.locator("[data-testid='stMarkdownContainer']", has_text=by_variance)
    expect(cards).to_have_count(3, timeout=WAIT_MS)
    expect(page.locator("[data-testid='stCode']", has_text=CHANGED[2])).to_have_count(0)
    page.screenshot(path=shots / "samples-dropped.png")

    page.goto(f"{server}/samples?run=2&outcome=kept")
    long = page.locator("[data-testid='stCode'] pre", has_text=END)
    long.wait_for(timeout=WAIT_MS)
    assert " ".join(long.inner_text().split()) == LONG
    width, seen_width, height, seen_height = long.evaluate(
        "e => [e.scrollWidth, e.clientWidth, e.scrollHeight, e.clientHeight]"
    )
    assert width <= seen_width and height <= seen_height  # wrapped; no part scrolled away
    box = long.bounding_box()
    assert box["x"] >= 0 and box["x"] + box["width"] <= 1400
    long.scroll_into_view_if_needed()
    page.screenshot(path=shots / "samples-long.png")

    page.goto(f"{server}/samples?run=2&view=compare&prompt=1")
    page.get_by_text("Changes from step 1 to step 2").wait_for(timeout=WAIT_MS)
    for text in CHANGED.values():
        page.locator("[data-testid='stCode']", has_text=text).wait_for(timeout=WAIT_MS)
    removed = page.locator(".stMarkdownColoredBackground del", has_text="plus")
    added = page.locator(".stMarkdownColoredBackground", has_text="times")
    expect(removed).to_be_visible(timeout=WAIT_MS)
    expect(added.last).to_be_visible(timeout=WAIT_MS)
    page.get_by_text("Changes from step 1 to step 2").scroll_into_view_if_needed()
    page.screenshot(path=shots / "samples-compare.png")


def test_the_sweep_page_in_chromium(server, browser, shots):
    """The runs best first, the options-against-objective chart drawn, and the best run's
    link opening its Run page."""
    page = browser.new_page(viewport={"width": 1400, "height": 1300})
    page.goto(f"{server}/sweep?sweep=1")
    page.get_by_role("heading", name="noise-sweep").wait_for(timeout=WAIT_MS)
    chart = page.locator("[data-testid='stVegaLiteChart']").locator("svg, canvas")
    chart.first.wait_for(timeout=WAIT_MS)
    # the grid's cells are in the DOM for accessibility, in the order the table shows them
    cells = page.locator("[data-testid='stDataFrame'] [role='gridcell']")
    playwright_api.expect(cells.first).to_be_attached(timeout=WAIT_MS)
    names = [t for t in cells.all_inner_texts() if t.startswith("noise-sweep-t")]
    assert names[:2] == ["noise-sweep-t001", "noise-sweep-t000"]
    page.screenshot(path=shots / "sweep.png", full_page=True)

    page.get_by_role("link", name=re.compile("Best run: noise-sweep-t001")).click()
    page.get_by_role("heading", name="noise-sweep-t001").wait_for(timeout=WAIT_MS)
    # the Sweep page's tab (?tab=Search+space) rides along until the Run page's own tabs,
    # which know no such tab, drop it on their first run: wait for that, do not race it
    playwright_api.expect(page).to_have_url(re.compile(r"/run\?run=4$"), timeout=WAIT_MS)


def triggered_watches(frames: list[bytes | str]) -> list[str]:
    """The version watches whose trigger each of `frames` (sent by the page) carries, in
    order: the key of each (`status_watch`, `charts_watch`), "" for a frame without one."""
    keys = []
    for frame in frames:
        msg = BackMsg()
        msg.ParseFromString(frame if isinstance(frame, bytes) else frame.encode())
        ids = [w.id for w in msg.rerun_script.widget_states.widgets if w.id.endswith("__events")]
        keys.append(
            next((k for k in ("status_watch", "charts_watch") if any(k in i for i in ids)), "")
        )
    return keys


def test_run_page_redraws_itself_when_the_run_changes(server, browser, seeded_url, shots):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    frames: list[bytes | str] = []
    page.on("websocket", lambda ws: ws.on("framesent", lambda frame: frames.append(frame)))
    asks: list[str] = []  # the page's requests for its version
    page.on("request", lambda r: asks.append(r.url) if "/api/live/" in r.url else None)
    page.goto(f"{server}/run?run=1")
    page.get_by_text("2 / 5").wait_for(timeout=WAIT_MS)
    page.locator("[data-testid='stVegaLiteChart']").first.wait_for(timeout=WAIT_MS)  # drawn
    asked = len(frames)
    assert asked  # the frames are seen: the page's first run was asked for
    elapsed = page.locator(".st-key-elapsed [data-testid='stMetricValue']")
    counted, asks_before = elapsed.inner_text(), len(asks)
    page.wait_for_timeout(3000)  # Playwright records frames and requests only while called
    assert len(frames) == asked  # no timer and no clock: nothing changed, nothing asked
    assert len(asks) - asks_before <= 1  # the route holds the page's ask until a change
    assert elapsed.inner_text() != counted  # the elapsed time counts in the browser
    assert re.fullmatch(r"\d+(m \d\ds|h \d\dm)", elapsed.inner_text())  # as views.duration
    page.screenshot(path=shots / "run-live.png")
    store = Store(seeded_url)
    try:
        for step in (3, 4, 5):
            before, start = len(frames), time.monotonic()
            store.record_step(
                1, StepReport(step=step, metrics={mk.reward_key(mk.TRAIN): 0.9}, wall_time=1e3)
            )
            page.get_by_text(f"{step} / 5").wait_for(timeout=NEW_STEP_MS)  # no reload
            # the status (which shows the step) first, then the charts, once each (a third
            # when a redraw read the run just before the step); a loaded machine may take
            # seconds for the second
            deadline = start + NEW_STEP_MS / 1000
            while len(frames) - before < 2 and time.monotonic() < deadline:
                page.wait_for_timeout(200)
            page.wait_for_timeout(2000)
            # and no more: a watch redrawn stops asking, else each step would be asked for by
            # every older one too
            asked_for = triggered_watches(frames[before:])
            assert asked_for[:2] == ["status_watch", "charts_watch"], (step, asked_for)
            assert len(asked_for) <= 3, (step, asked_for)
        store.set_status(1, RunStatus.SUCCEEDED)
        page.get_by_text("succeeded").wait_for(timeout=WAIT_MS)
    finally:
        store.close()
    page.screenshot(path=shots / "run-succeeded.png")
