"""What the browser tests share: Debian's Chromium (never a downloaded browser) driven by
Playwright, a free port, and where screenshots go ($ESLAB_TEST_OUTPUT or the test's tmp)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
WAIT_MS = 120_000
"""How long a browser test waits for what a page should show. A page that renders in 4-7 s
alone took over 30 s on a 2-core CI machine while the other test worker ran a vLLM engine:
the tests check what appears, never how fast (bench/dashboard.py measures that)."""
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


class PatientBrowser:
    """A Playwright browser whose new pages and contexts wait WAIT_MS by default (30 s is
    Playwright's): a click or a navigation on a loaded CI machine takes longer.

    It remembers what it opened, for `close_opened` at the end of each test: a page left open
    on a live Run or Runs page reruns its script and redraws every second for the rest of
    the module, on the cores the next tests (and the other worker's engine) need."""

    def __init__(self, browser: object) -> None:
        self.browser = browser
        self.opened: list[object] = []

    def new_page(self, **options: object) -> object:
        page = self.browser.new_page(**options)
        page.set_default_timeout(WAIT_MS)
        self.opened.append(page)
        return page

    def new_context(self, **options: object) -> object:
        context = self.browser.new_context(**options)
        context.set_default_timeout(WAIT_MS)
        self.opened.append(context)
        return context

    def close_opened(self) -> None:
        """Close every page and context opened through this object (a context closes its
        pages)."""
        while self.opened:
            self.opened.pop().close()

    def __getattr__(self, name: str) -> object:
        return getattr(self.browser, name)


def playwright_or_skip():
    """The playwright.sync_api module; skips the calling module without it or Chromium."""
    api = pytest.importorskip(
        "playwright.sync_api", reason="the pip package `playwright` is not installed"
    )
    if not Path(CHROMIUM).exists():
        pytest.skip(
            f"{CHROMIUM} is missing: install the Debian packages chromium and chromium-driver",
            allow_module_level=True,
        )
    return api


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def shots_folder(tmp_path: Path) -> Path:
    folder = Path(os.environ.get("ESLAB_TEST_OUTPUT", tmp_path))
    folder.mkdir(parents=True, exist_ok=True)
    return folder
