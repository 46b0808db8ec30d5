"""Failed logins slow down, per user name and per client, with a wait that doubles after a
few free tries and never exceeds MAX_DELAY_S: a guesser gets a few tries a minute, and the
real user, whose name a guesser may be trying, waits a minute or two at worst, never hours.

The state is one object for the whole process: Streamlit keeps a session per browser tab,
so anything kept in st.session_state would start afresh in a new tab. Entries are forgotten
FORGET_AFTER_S after their last try, and at most MAX_ENTRIES are kept (the stalest go), so a
flood of made-up names cannot grow the process.

An attempt counts as failed from the moment it is allowed: concurrent attempts (many tabs at
once) are all counted before any password check finishes. A success takes its count back."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

FREE_ATTEMPTS = 3  # typos cost nothing
FIRST_DELAY_S = 1.0  # then 1, 2, 4, ... s
MAX_DELAY_S = 120.0
FORGET_AFTER_S = 900.0
MAX_ENTRIES = 10_000


@dataclass
class _Entry:
    failures: int = 0
    last: float = 0.0


class LoginThrottle:
    """Thread-safe throttle of login attempts; `clock` (seconds, monotonic) is injectable
    for tests."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._entries: dict[str, _Entry] = {}

    @staticmethod
    def delay(failures: int) -> float:
        """The wait after `failures` counted attempts."""
        if failures < FREE_ATTEMPTS:
            return 0.0
        return min(FIRST_DELAY_S * 2 ** (failures - FREE_ATTEMPTS), MAX_DELAY_S)

    def attempt(self, user: str, client: str) -> float:
        """0.0 when `user` may try to log in from `client` now (the try is then counted as
        failed until `succeeded`); otherwise the seconds to wait, and nothing is counted."""
        keys = _keys(user, client)
        with self._lock:
            now = self._clock()
            entries = [self._entry(key, now) for key in keys]
            wait = max(e.last + self.delay(e.failures) - now for e in entries)
            if wait > 0:
                return wait
            for key, entry in zip(keys, entries, strict=True):
                entry.failures += 1
                entry.last = now
                self._entries[key] = entry
            self._prune()
            return 0.0

    def succeeded(self, user: str, client: str) -> None:
        """The password was right: the user name starts afresh; the client only gets this
        attempt back (logging in to one's own account does not clear a client's guesses)."""
        user_key, client_key = _keys(user, client)
        with self._lock:
            self._entries.pop(user_key, None)
            entry = self._entries.get(client_key)
            if entry is not None:
                entry.failures = max(entry.failures - 1, 0)

    def _entry(self, key: str, now: float) -> _Entry:
        entry = self._entries.get(key)
        if entry is None or now - entry.last > FORGET_AFTER_S:
            return _Entry()
        return entry

    def _prune(self) -> None:
        if len(self._entries) <= MAX_ENTRIES:
            return
        stalest = sorted(self._entries, key=lambda k: self._entries[k].last)
        for key in stalest[: len(self._entries) - MAX_ENTRIES // 2]:
            del self._entries[key]


def _keys(user: str, client: str) -> tuple[str, str]:
    return f"user:{user[:200]}", f"client:{client}"


THROTTLE = LoginThrottle()  # the dashboard process's one throttle
