"""Failed logins slow down per user name and per client (app/login_throttle.py): the rule on
an injected clock, then the login form under AppTest, where two tabs share one throttle."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from streamlit.runtime.context import ContextProxy
from streamlit.testing.v1 import AppTest

from app import auth, login_throttle
from app.login_throttle import (
    FREE_ATTEMPTS,
    MAX_DELAY_S,
    USER_DECAY_S,
    USER_LIMIT,
    LoginThrottle,
)

MAIN = str(Path(__file__).resolve().parents[2] / "app" / "main.py")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


def fail(throttle: LoginThrottle, times: int, user: str = "alice", client: str = "1.2.3.4"):
    for _ in range(times):
        assert throttle.attempt(user, client) == 0.0


def test_a_few_tries_are_free_then_the_wait_doubles_up_to_the_cap(clock):
    throttle = LoginThrottle(clock)
    fail(throttle, FREE_ATTEMPTS - 1)
    assert throttle.attempt("alice", "1.2.3.4") == 0.0  # the last free one
    waits = []
    for _ in range(12):
        wait = throttle.attempt("alice", "1.2.3.4")
        waits.append(wait)
        clock.now += wait  # wait exactly as told, then try (and fail) again
        assert throttle.attempt("alice", "1.2.3.4") == 0.0
    assert waits[:4] == [1.0, 2.0, 4.0, 8.0]
    assert max(waits) == MAX_DELAY_S == waits[-1]


def test_a_refused_attempt_is_not_counted(clock):
    throttle = LoginThrottle(clock)
    fail(throttle, FREE_ATTEMPTS)
    for _ in range(50):  # hammering while refused does not lengthen the wait
        assert throttle.attempt("alice", "1.2.3.4") == 1.0
    clock.now += 1.0
    assert throttle.attempt("alice", "1.2.3.4") == 0.0


def test_many_names_from_one_address_are_throttled(clock):
    throttle = LoginThrottle(clock)
    for i in range(FREE_ATTEMPTS):
        assert throttle.attempt(f"user{i}", "6.6.6.6") == 0.0
    assert throttle.attempt("carol", "6.6.6.6") > 0
    assert throttle.attempt("carol", "7.7.7.7") == 0.0  # another address


def test_a_guesser_at_one_address_never_holds_the_owner_back(clock):
    """Guessing the owner's name for hours, each try as soon as allowed (one every 2
    minutes): the owner, at another address, still gets in at once (the old per-name wait
    kept them out for as long as the guessing went on)."""
    throttle = LoginThrottle(clock)
    for _ in range(500):
        clock.now += throttle.attempt("alice", "6.6.6.6") or 1.0
    assert throttle.attempt("alice", "6.6.6.6") > 0  # the guesser is slowed down
    assert throttle.attempt("alice", "10.0.0.7") == 0.0  # the owner is not


def test_many_addresses_share_one_limit_per_name_that_decays(clock):
    throttle = LoginThrottle(clock)
    assert throttle.attempt("alice", "10.0.0.7") == 0.0
    throttle.succeeded("alice", "10.0.0.7")  # the owner's usual address
    for i in range(USER_LIMIT):  # a botnet, one guess per address
        assert throttle.attempt("alice", f"172.16.{i // 250}.{i % 250}") == 0.0
    wait = throttle.attempt("alice", "172.31.0.1")  # a fresh address: refused
    assert wait == USER_DECAY_S
    assert throttle.attempt("bob", "172.31.0.1") == 0.0  # other names are not held back
    assert throttle.attempt("alice", "10.0.0.7") == 0.0  # the owner's address still is not
    throttle.succeeded("alice", "10.0.0.7")
    clock.now += wait
    assert throttle.attempt("alice", "172.31.0.2") == 0.0  # decayed: one more guess
    assert throttle.attempt("alice", "172.31.0.3") > 0


def test_a_known_address_is_forgotten_after_a_long_while(clock):
    throttle = LoginThrottle(clock)
    throttle.attempt("alice", "10.0.0.7")
    throttle.succeeded("alice", "10.0.0.7")
    clock.now += login_throttle.KNOWN_FOR_S + 1
    for i in range(USER_LIMIT):
        throttle.attempt("alice", f"172.16.0.{i}")
    assert throttle.attempt("alice", "10.0.0.7") > 0


def test_a_success_clears_the_name_but_not_the_clients_other_guesses(clock):
    throttle = LoginThrottle(clock)
    fail(throttle, FREE_ATTEMPTS - 1, user="alice")
    assert throttle.attempt("alice", "1.2.3.4") == 0.0
    throttle.succeeded("alice", "1.2.3.4")  # the last try was the right password
    clock.now += 1.0
    assert throttle.attempt("alice", "5.6.7.8") == 0.0  # the name starts afresh
    # the client keeps its earlier failures: a guesser's own login does not wipe them
    assert throttle.attempt("mallory", "1.2.3.4") == 0.0
    assert throttle.attempt("mallory", "1.2.3.4") > 0


def test_failures_are_forgotten_after_a_quiet_while(clock):
    throttle = LoginThrottle(clock)
    fail(throttle, FREE_ATTEMPTS)
    assert throttle.attempt("alice", "1.2.3.4") > 0
    clock.now += login_throttle.FORGET_AFTER_S + 1
    fail(throttle, FREE_ATTEMPTS)  # free tries again


def test_concurrent_attempts_are_all_counted_before_any_check_ends(clock):
    """Many tabs at once: only the free tries get through, however they interleave."""
    throttle = LoginThrottle(clock)
    with ThreadPoolExecutor(8) as pool:
        waits = list(pool.map(lambda _: throttle.attempt("alice", "1.2.3.4"), range(64)))
    assert waits.count(0.0) == FREE_ATTEMPTS


def test_the_table_of_entries_is_bounded(clock, monkeypatch):
    monkeypatch.setattr(login_throttle, "MAX_ENTRIES", 100)
    throttle = LoginThrottle(clock)
    for i in range(1000):
        clock.now += 0.001
        throttle.attempt(f"name{i}", f"client{i}")
    assert max(len(throttle._entries), len(throttle._levels)) <= 100
    assert throttle.attempt("name999", "client999") == 0.0  # the newest are kept: 2nd try


# -- the login form -------------------------------------------------------------------------


@pytest.fixture
def users(tmp_path, monkeypatch, clock, seeded_url) -> Clock:
    path = tmp_path / "users.yaml"
    auth.add_user(path, "ed", "editor", "editor-pass")
    monkeypatch.setenv(auth.ENV, str(path))
    monkeypatch.setenv("ESLAB_DATABASE_URL", seeded_url)
    monkeypatch.setattr("app.login.THROTTLE", LoginThrottle(clock))
    # AppTest gives each session a mock for an address; every tab here is one browser
    monkeypatch.setattr(ContextProxy, "ip_address", property(lambda _: "10.0.0.7"))
    return clock


def log_in(at: AppTest, name: str, password: str) -> AppTest:
    at.text_input(key="login_name").input(name)
    at.text_input(key="login_password").input(password)
    return at.button[0].click().run()


def test_the_form_slows_down_guessing_even_from_a_new_tab(users):
    clock = users
    tab = AppTest.from_file(MAIN, default_timeout=60).run()
    for _ in range(FREE_ATTEMPTS):
        assert "wrong password" in log_in(tab, "ed", "guess-guess").error[0].value
    other_tab = AppTest.from_file(MAIN, default_timeout=60).run()  # a new session
    log_in(other_tab, "ed", "editor-pass")  # the right password, but too soon
    assert other_tab.error[0].value == "Too many failed logins: try again in 1 s."
    assert auth.SESSION_KEY not in other_tab.session_state
    clock.now += 1.0
    log_in(other_tab, "ed", "editor-pass")
    assert not other_tab.exception
    assert other_tab.session_state[auth.SESSION_KEY].name == "ed"


def test_a_throttled_attempt_is_refused_before_its_password_is_hashed(users, monkeypatch):
    hashed = []
    real = auth.verify_password
    monkeypatch.setattr(auth, "verify_password", lambda *a: hashed.append(1) or real(*a))
    tab = AppTest.from_file(MAIN, default_timeout=60).run()
    for _ in range(FREE_ATTEMPTS + 5):
        log_in(tab, "ed", "guess-guess")
    assert tab.error[0].value.startswith("Too many failed logins")
    assert len(hashed) == FREE_ATTEMPTS


def test_logins_wait_for_a_free_hashing_slot_and_count_nothing_when_none_comes(users, monkeypatch):
    """Every slot taken (by logins from many addresses at once): the attempt is refused
    before it is counted or hashed, and the next one, with a slot free, goes through."""
    monkeypatch.setattr(login_throttle, "HASH_WAIT_S", 0.0)
    hashed = []
    real = auth.verify_password
    monkeypatch.setattr(auth, "verify_password", lambda *a: hashed.append(1) or real(*a))
    taken = [login_throttle.hash_slot() for _ in range(login_throttle.MAX_CONCURRENT_HASHES)]
    assert all(slot.__enter__() for slot in taken)
    tab = AppTest.from_file(MAIN, default_timeout=60).run()
    for _ in range(FREE_ATTEMPTS + 1):
        log_in(tab, "ed", "editor-pass")
        assert tab.error[0].value.startswith("The server is busy with other logins")
    assert hashed == [] and auth.SESSION_KEY not in tab.session_state
    for slot in taken:
        slot.__exit__(None, None, None)
    log_in(tab, "ed", "editor-pass")  # none of the busy ones was counted as a failure
    assert tab.session_state[auth.SESSION_KEY].name == "ed"


# -- the client address ---------------------------------------------------------------------


def client_seen(peer: str, forwarded_for: str, monkeypatch) -> str:
    """The client address the dashboard's server (uvicorn, as `eslab serve` configures it
    through the environment) hands to Streamlit for a request from `peer`."""
    import asyncio

    import uvicorn

    from jobs.service import dashboard_env

    monkeypatch.setenv("FORWARDED_ALLOW_IPS", dashboard_env()["FORWARDED_ALLOW_IPS"])
    seen = []

    async def app(scope, receive, send):
        seen.append(scope["client"][0])

    config = uvicorn.Config(app, lifespan="off")
    config.load()
    scope = {
        "type": "http",
        "client": (peer, 40000),
        "headers": [(b"x-forwarded-for", forwarded_for.encode())],
    }
    asyncio.run(config.loaded_app(scope, None, None))
    return seen[0]


def test_a_forwarded_address_is_believed_from_no_one_by_default(monkeypatch):
    """uvicorn's own default believes X-Forwarded-For from 127.0.0.1: any account on a
    shared machine could then make each guess come from "another address"."""
    monkeypatch.delenv("ESLAB_TRUSTED_PROXIES", raising=False)
    assert client_seen("127.0.0.1", "6.6.6.6", monkeypatch) == "127.0.0.1"
    assert client_seen("::1", "6.6.6.6", monkeypatch) == "::1"


def test_a_forwarded_address_is_believed_from_the_listed_proxies_only(monkeypatch):
    monkeypatch.setenv("ESLAB_TRUSTED_PROXIES", "10.0.0.5, 192.168.7.0/24")
    assert client_seen("10.0.0.5", "6.6.6.6", monkeypatch) == "6.6.6.6"
    assert client_seen("192.168.7.9", "6.6.6.6", monkeypatch) == "6.6.6.6"
    assert client_seen("127.0.0.1", "6.6.6.6", monkeypatch) == "127.0.0.1"
