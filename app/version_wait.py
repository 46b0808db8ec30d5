"""A live page's ask for its version held until the version changes (a long poll): between
two steps of a run, a viewer's page asks once per HOLD_SECONDS instead of once a second,
and still hears of a change within live.POLL_SECONDS (and live.FRESH_SECONDS). The requests
held on one page's version share its reads: one of them reads it, at most once per
POLL_SECONDS, and the others wait for that read, so twenty viewers of a run cost the
dashboard two reads a second between steps, not twenty requests. Everything here runs on
the server's event loop."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import anyio

from app import live
from app.live import Version

HOLD_SECONDS = 25.0
"""How long a request is held at most, unanswered: under the idle timeouts of the proxies
that may stand between a viewer and the dashboard (often 30 to 60 s); the page then asks
again."""


@dataclass
class _Reads:
    """The reads of one page's version shared by the requests held on it: the newest, when
    it was read (time.monotonic), the read in progress (set when done), how many wait."""

    version: Version | None = None
    read_at: float = float("-inf")
    reading: anyio.Event | None = None
    waiting: int = 0


_pages: dict[str, _Reads] = {}


async def version_after(subject: str, read: Callable[[], Version], since: str) -> Version:
    """The version of the page bound to `subject` (`read` reads it, blocking) once its state
    differs from `since`, or as it is when HOLD_SECONDS passed first."""
    reads = _pages.setdefault(subject, _Reads())
    reads.waiting += 1
    try:
        with anyio.move_on_after(HOLD_SECONDS):
            while True:
                version = await _next_read(reads, read)
                if version is not None and version.state != since:
                    return version
        return reads.version or await anyio.to_thread.run_sync(read)
    finally:
        reads.waiting -= 1
        if not reads.waiting and _pages.get(subject) is reads:
            del _pages[subject]  # nobody waits: nothing kept for a page no one watches


async def _next_read(reads: _Reads, read: Callable[[], Version]) -> Version | None:
    """The version as read next, no sooner than POLL_SECONDS after the read before: by this
    request when no other is reading it, else by that one (if that one was cancelled
    before it read, the one before, or None when there was none)."""
    if reads.reading is not None:
        await reads.reading.wait()
        return reads.version
    done = reads.reading = anyio.Event()
    try:
        await anyio.sleep(max(0.0, reads.read_at + live.POLL_SECONDS - time.monotonic()))
        reads.version = await anyio.to_thread.run_sync(read)
        reads.read_at = time.monotonic()
        return reads.version
    finally:
        reads.reading = None
        done.set()
