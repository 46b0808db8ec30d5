"""Failed logins slow down per user name and per client (app/login_throttle.py): the rule on
an injected clock, then the login form under AppTest, where two tabs share one throttle."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from app import auth, login_throttle
from app.login_throttle import FREE_ATTEMPTS, MAX_DELAY_S, LoginThrottle

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


def test_per_user_name_across_clients_and_per_client_across_names(clock):
    throttle = LoginThrottle(clock)
    for i in range(FREE_ATTEMPTS):  # one name from many addresses
        assert throttle.attempt("alice", f"10.0.0.{i}") == 0.0
    assert throttle.attempt("alice", "10.0.0.99") > 0
    assert throttle.attempt("bob", "10.0.0.99") == 0.0  # another name, another client
    for i in range(FREE_ATTEMPTS):  # many names from one address
        assert throttle.attempt(f"user{i}", "6.6.6.6") == 0.0
    assert throttle.attempt("carol", "6.6.6.6") > 0


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
    assert len(throttle._entries) <= 100
    assert throttle.attempt("name999", "client999") == 0.0  # the newest are kept: 2nd try


# -- the login form -------------------------------------------------------------------------


@pytest.fixture
def users(tmp_path, monkeypatch, clock, seeded_url) -> Clock:
    path = tmp_path / "users.yaml"
    auth.add_user(path, "ed", "editor", "editor-pass")
    monkeypatch.setenv(auth.ENV, str(path))
    monkeypatch.setenv("ESLAB_DATABASE_URL", seeded_url)
    monkeypatch.setattr("app.login.THROTTLE", LoginThrottle(clock))
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
