"""Failed logins slow down, so that guessing a password is slow, and without letting a guesser
lock the real user out.

Three counts, each a reason to refuse an attempt before its password is hashed:

- per (user name, client): a few free tries, then a wait that doubles up to MAX_DELAY_S. A
  guesser at one address slows only their own tries at that name: the owner, at another
  address, is not held back by them.
- per client, across names: the same wait, so one address cannot try many names.
- per user name, across clients: a level that each failure raises by one and that falls by
  one every USER_DECAY_S. Past USER_LIMIT, tries from addresses the user has not logged in
  from are refused until it falls: guessers at many addresses get about one guess a minute
  in all, for as long as they go on. Addresses where the user logged in before are exempt,
  so the owner still gets in from their own address however long an attack lasts; from a
  new address they wait for the attack to stop.

The state is one object for the whole process: Streamlit keeps a session per browser tab,
so anything kept in st.session_state would start afresh in a new tab. Entries are forgotten
FORGET_AFTER_S after their last try (known addresses after KNOWN_FOR_S), and at most
MAX_ENTRIES of each kind are kept (the stalest go), so a flood of made-up names cannot grow
the process.

An attempt counts as failed from the moment it is allowed: concurrent attempts (many tabs at
once) are all counted before any password check finishes. A success takes its count back.

Hashing a password (scrypt, ~16 MiB and tens of milliseconds) is also capped by `hash_slot`:
at most MAX_CONCURRENT_HASHES at once, so that attempts from many addresses at once cannot
take the dashboard's memory and cores."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

FREE_ATTEMPTS = 3  # typos cost nothing
FIRST_DELAY_S = 1.0  # then 1, 2, 4, ... s
MAX_DELAY_S = 120.0
FORGET_AFTER_S = 900.0
MAX_ENTRIES = 10_000
USER_LIMIT = 20  # failures of one name, from every address, before unknown addresses wait
USER_DECAY_S = 60.0  # the level falls by one this often
KNOWN_FOR_S = 30 * 24 * 3600.0  # an address the user logged in from stays known this long
MAX_CONCURRENT_HASHES = 2
HASH_WAIT_S = 2.0  # how long an attempt waits for a free hashing slot before "busy"


@dataclass
class _Entry:
    failures: int = 0
    last: float = 0.0


@dataclass
class _Level:
    """Failures of one user name that decay: `value` as of `at`."""

    value: float = 0.0
    at: float = 0.0

    def now(self, now: float) -> float:
        return max(self.value - (now - self.at) / USER_DECAY_S, 0.0)


class LoginThrottle:
    """Thread-safe throttle of login attempts; `clock` (seconds, monotonic) is injectable
    for tests."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._entries: dict[str, _Entry] = {}
        self._levels: dict[str, _Level] = {}
        self._known: dict[tuple[str, str], float] = {}

    @staticmethod
    def delay(failures: int) -> float:
        """The wait after `failures` counted attempts."""
        if failures < FREE_ATTEMPTS:
            return 0.0
        return min(FIRST_DELAY_S * 2 ** (failures - FREE_ATTEMPTS), MAX_DELAY_S)

    def attempt(self, user: str, client: str) -> float:
        """0.0 when `user` may try to log in from `client` now (the try is then counted as
        failed until `succeeded`); otherwise the seconds to wait, and nothing is counted."""
        user = user[:200]
        keys = _keys(user, client)
        with self._lock:
            now = self._clock()
            entries = [self._entry(key, now) for key in keys]
            wait = max(e.last + self.delay(e.failures) - now for e in entries)
            level = self._levels.get(user, _Level()).now(now)
            if level >= USER_LIMIT and not self._is_known(user, client, now):
                wait = max(wait, (level - USER_LIMIT + 1) * USER_DECAY_S)
            if wait > 0:
                return wait
            for key, entry in zip(keys, entries, strict=True):
                entry.failures += 1
                entry.last = now
                self._entries[key] = entry
            self._levels[user] = _Level(level + 1, now)
            self._prune()
            return 0.0

    def succeeded(self, user: str, client: str) -> None:
        """The password was right: the name starts afresh at this address, which becomes
        one the user is known at; the client and the name's level only get this attempt
        back (logging in to one's own account does not clear a client's guesses at other
        names, nor others' guesses at this one)."""
        user = user[:200]
        pair_key, client_key = _keys(user, client)
        with self._lock:
            now = self._clock()
            self._entries.pop(pair_key, None)
            entry = self._entries.get(client_key)
            if entry is not None:
                entry.failures = max(entry.failures - 1, 0)
            level = self._levels.get(user)
            if level is not None:
                self._levels[user] = _Level(max(level.now(now) - 1, 0.0), now)
            self._known[(user, client)] = now
            self._prune()

    def _is_known(self, user: str, client: str, now: float) -> bool:
        since = self._known.get((user, client))
        return since is not None and now - since <= KNOWN_FOR_S

    def _entry(self, key: str, now: float) -> _Entry:
        entry = self._entries.get(key)
        if entry is None or now - entry.last > FORGET_AFTER_S:
            return _Entry()
        return entry

    def _prune(self) -> None:
        _keep_newest(self._entries, lambda e: e.last)
        _keep_newest(self._levels, lambda level: level.at)
        _keep_newest(self._known, lambda since: since)


def _keep_newest(table: dict, when: Callable) -> None:
    """At most MAX_ENTRIES in `table`: past that, it is cut to half, the stalest going."""
    if len(table) <= MAX_ENTRIES:
        return
    stalest = sorted(table, key=lambda k: when(table[k]))
    for key in stalest[: len(table) - MAX_ENTRIES // 2]:
        del table[key]


def _keys(user: str, client: str) -> tuple[str, str]:
    return f"pair:{client}\0{user}", f"client:{client}"


_HASHING = threading.BoundedSemaphore(MAX_CONCURRENT_HASHES)


@contextmanager
def hash_slot() -> Iterator[bool]:
    """True (inside a slot) when a password may be hashed now, after waiting up to
    HASH_WAIT_S for one; False when the slots stay taken (the caller says "busy")."""
    acquired = _HASHING.acquire(timeout=HASH_WAIT_S)
    try:
        yield acquired
    finally:
        if acquired:
            _HASHING.release()


THROTTLE = LoginThrottle()  # the dashboard process's one throttle
