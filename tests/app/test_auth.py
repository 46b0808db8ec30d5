"""Logins and roles (app/auth.py): password hashing, the auth file and its errors, the
`eslab users` commands, and under AppTest: the login form, a viewer who sees no action
buttons and whose direct calls of the action functions are refused, an editor who can act,
and a user removed, demoted or given a new password who loses the rights at the next action."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import streamlit as st
import yaml
from streamlit.testing.v1 import AppTest

from app import auth
from app.cli import main
from app.login_throttle import LoginThrottle
from jobs.store.status import RunStatus, SweepStatus
from jobs.store.store import Store

MAIN = str(Path(__file__).resolve().parents[2] / "app" / "main.py")
TIMEOUT = 60
EDITOR = auth.User("ed", "editor")
VIEWER = auth.User("vi", "viewer")


def session_of(user: auth.User) -> auth.Session:
    """The session a login of `user` (a name of the configured auth file) would make."""
    return auth.signed_in(auth.load_users(auth.auth_path())[user.name])


# -- hashing and the file -------------------------------------------------------------------


def test_hash_is_salted_and_verifies():
    first, second = auth.hash_password("correct horse"), auth.hash_password("correct horse")
    assert first != second and "correct horse" not in first  # salted, never the password
    assert first.startswith(f"scrypt${auth.SCRYPT_N}$")
    assert auth.verify_password("correct horse", first)
    assert not auth.verify_password("correct hors", first)
    assert not auth.verify_password("correct horse", "scrypt$1$2$3$not-base64!$x")
    assert not auth.verify_password("correct horse", "plain-password")


def test_a_short_password_is_refused():
    with pytest.raises(auth.AuthError, match="at least 8 characters, got 3"):
        auth.hash_password("abc")


@pytest.mark.parametrize("suffix", [".yaml", ".toml"])
def test_add_list_remove_round_trip(tmp_path, suffix):
    path = tmp_path / f"users{suffix}"
    auth.add_user(path, "ed", "editor", "editor-pass")
    auth.add_user(path, "vi", "viewer", "viewer-pass")
    users = auth.load_users(path)
    assert {u.name: u.role for u in users.values()} == {"ed": "editor", "vi": "viewer"}
    assert "editor-pass" not in path.read_text()
    assert path.stat().st_mode & 0o077 == 0  # readable by its owner only
    assert auth.authenticate(users, "ed", "editor-pass") == users["ed"]
    assert auth.authenticate(users, "ed", "viewer-pass") is None
    assert auth.authenticate(users, "nobody", "editor-pass") is None
    auth.remove_user(path, "vi")
    assert list(auth.load_users(path)) == ["ed"]
    with pytest.raises(auth.AuthError, match="no user 'vi'"):
        auth.remove_user(path, "vi")


@pytest.mark.parametrize(
    "content, message",
    [
        ("users: [alice]", "must hold a mapping"),
        (
            "users:\n  alice: {role: admin, password: x}",
            "role must be one of viewer, editor, got 'admin'",
        ),
        ("users:\n  alice: {role: editor, password: hunter22}", "plain passwords are refused"),
        ("users:\n  alice: editor", "must be a mapping with role and password"),
        ("users: {alice: [", "cannot be read"),
    ],
)
def test_a_malformed_file_names_the_file_and_the_problem(tmp_path, content, message):
    path = tmp_path / "users.yaml"
    path.write_text(content)
    with pytest.raises(auth.AuthError, match=message) as info:
        auth.load_users(path)
    assert str(path) in str(info.value)


def test_a_missing_file_says_how_to_create_it(tmp_path):
    with pytest.raises(auth.AuthError, match="does not exist; create it with `eslab users add"):
        auth.load_users(tmp_path / "nope.yaml")


def test_roles(monkeypatch, tmp_path):
    monkeypatch.delenv(auth.ENV, raising=False)
    assert auth.require_editor("cancel runs") is auth.LOCAL_USER  # no file: open
    monkeypatch.setenv(auth.ENV, str(tmp_path / "users.yaml"))
    st.session_state.clear()
    with pytest.raises(auth.PermissionDenied, match="log in as an editor to cancel runs"):
        auth.require_editor("cancel runs")


def test_users_cli(tmp_path, monkeypatch, capsys):
    path = tmp_path / "auth.toml"
    monkeypatch.setattr("sys.stdin", __import__("io").StringIO("s3cret-pass\n"))
    assert (
        main(["users", "--file", str(path), "add", "ed", "--role", "editor", "--password-stdin"])
        == 0
    )
    monkeypatch.setenv(auth.ENV, str(path))
    assert main(["users", "list"]) == 0
    assert "ed\teditor" in capsys.readouterr().out
    assert auth.authenticate(auth.load_users(path), "ed", "s3cret-pass")
    assert main(["users", "remove", "ghost"]) == 2
    assert "no user 'ghost'" in capsys.readouterr().err
    path.write_text("[users.ed]\nrole = 'root'\n")
    assert main(["users", "list"]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and "role must be one of" in err


# -- the dashboard --------------------------------------------------------------------------


@pytest.fixture
def store(store, editor_and_viewer, monkeypatch):
    """The seeded database behind an auth file with one editor and one viewer."""
    monkeypatch.setattr("app.login.THROTTLE", LoginThrottle())  # no failures of other tests
    return store


def as_user(user: auth.User | None, path: str | None = None, **params: str) -> AppTest:
    at = AppTest.from_file(MAIN, default_timeout=TIMEOUT)
    if user is not None:
        at.session_state[auth.SESSION_KEY] = session_of(user)
    at.run()
    if path:
        for k, v in params.items():
            at.query_params[k] = v
        at.switch_page(path)
        at.run()
    return at


def test_login_is_required_and_remembered(store):
    at = as_user(None)
    assert not at.exception
    assert not at.dataframe  # nothing of the runs before a login
    at.text_input(key="login_name").input("ed")
    at.text_input(key="login_password").input("wrong-password")
    at.button[0].click().run()
    assert "wrong password" in at.error[0].value
    at.text_input(key="login_password").input("editor-pass")
    at.button[0].click().run()
    assert not at.exception
    assert at.session_state[auth.SESSION_KEY].name == "ed"
    assert set(at.dataframe[0].value["name"]) == {"alpha-run", "beta-run"}
    assert any("Signed in as **ed** (editor)" in c.value for c in at.sidebar.caption)
    at.sidebar.button(key="logout").click().run()
    assert not at.dataframe and auth.SESSION_KEY not in at.session_state


def test_a_malformed_auth_file_is_shown_not_a_traceback(store, monkeypatch, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("users: [x]")
    monkeypatch.setenv(auth.ENV, str(bad))
    at = as_user(None)
    assert not at.exception
    assert str(bad) in at.error[0].value


def test_viewer_sees_no_action_buttons(store):
    run = store.search_runs(text="alpha")[0][0]
    at = as_user(VIEWER, "app_pages/run.py", run=str(run.id))
    assert not at.exception
    labels = {b.label for b in at.button}
    assert not labels & {"Cancel", "Clone", "Resume"}
    at = as_user(VIEWER)
    assert not {b.label for b in at.button} & {"Cancel", "Clone", "Resume", "Delete"}
    at = as_user(VIEWER, "app_pages/new_run.py")
    assert next(b for b in at.button if b.label == "Queue run").disabled


ACTIONS = (
    "cancel runs",
    "resume runs",
    "delete runs",
    "launch runs",
    "start sweeps",
    "cancel sweeps",
    "clone runs",
)
"""What `act` does, in its order, as the refusals name it."""


def act(run_id: int, dataset: str, output_dir: str, clone: bool) -> None:
    """Calls every action function directly, as a page (or a forged button) would (clone
    last: for an editor it leaves this one-page script)."""
    from app import actions
    from app.state import get_store
    from engine.config import RunConfig
    from jobs.sweeps.spec import parse_space

    store = get_store()
    actions.cancel(store, run_id)
    actions.resume(store, run_id)
    actions.delete(store, [store.get_run(run_id)])
    config = RunConfig.from_flat(
        {
            "method": "es",
            "model": "HuggingFaceTB/SmolLM2-135M-Instruct",
            "train_file": dataset,
            "output_dir": output_dir,
            "reward_func_path": "engine.rewards.conciseness.compute_score",
        }
    )
    actions.launch(store, config)
    space = {
        "parameters": {"noise_std": {"values": [0.001, 0.002]}},
        "objective": "train/reward/mean",
    }
    sweep = actions.launch_sweep(store, config, parse_space(space, config), name="sw")
    actions.cancel_sweep(store, sweep.id if sweep else 1)
    if clone:
        actions.clone(run_id)


def act_as(user: auth.User, store: Store, dataset: Path, tmp_path: Path):
    """(AppTest, run) after `user` called every action on the running alpha-run."""
    run = store.search_runs(text="alpha")[0][0]
    at = AppTest.from_function(
        act,
        args=(run.id, str(dataset), str(tmp_path / "o"), not user.is_editor),
        default_timeout=TIMEOUT,
    )
    at.session_state[auth.SESSION_KEY] = session_of(user)
    at.run()
    assert not at.exception
    return at, run


def test_the_action_functions_refuse_a_viewer(store, dataset, tmp_path):
    at, run = act_as(VIEWER, store, dataset, tmp_path)
    errors = [e.value for e in at.error]
    assert errors == [f"vi is a viewer: only editors may {a}" for a in ACTIONS]
    assert store.get_run(run.id).status is RunStatus.RUNNING
    assert store.count_runs() == 2 and store.list_sweeps() == []


def test_the_action_functions_let_an_editor_act(store, dataset, tmp_path):
    at, run = act_as(EDITOR, store, dataset, tmp_path)
    assert store.get_run(run.id).status is RunStatus.CANCELLING
    # resume and delete were refused by the run's status (it is not finished), not the role
    assert all("only editors" not in e.value for e in at.error)
    assert store.count_runs() == 3  # the launched run
    (sweep,) = store.list_sweeps()  # started and cancelled, as its author
    assert (sweep.created_by, sweep.status) == ("ed", SweepStatus.CANCELLED)


def test_editor_cancels_from_the_run_page(store):
    run = store.search_runs(text="alpha")[0][0]
    at = as_user(EDITOR, "app_pages/run.py", run=str(run.id))
    at.button(key="run_cancel").click().run()
    assert not at.exception
    assert store.get_run(run.id).status is RunStatus.CANCELLING


def test_without_auth_file_everything_is_open(store, monkeypatch):
    monkeypatch.delenv(auth.ENV)
    at = as_user(None)
    assert not at.exception
    assert {"Clone", "Cancel", "Delete"} <= {b.label for b in at.button}
    assert not at.sidebar.caption or "Signed in" not in at.sidebar.caption[0].value


def test_yaml_file_written_by_hand_with_a_hash_loads(tmp_path):
    path = tmp_path / "users.yml"
    hashed = auth.hash_password("pw-pw-pw-pw")
    path.write_text(yaml.safe_dump({"users": {"a": {"role": "viewer", "password": hashed}}}))
    assert auth.load_users(path)["a"].role == "viewer"


def test_serve_refuses_a_malformed_auth_file_before_starting(tmp_path, monkeypatch, capsys):
    path = tmp_path / "users.toml"
    path.write_text("users = 3")
    monkeypatch.setenv(auth.ENV, str(path))
    assert main(["serve", "--port", "1"]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and "must hold a mapping" in err


# -- rights follow the file -----------------------------------------------------------------


def set_role(path: Path, name: str, role: str) -> None:
    """Change `name`'s role and nothing else (the password hash stays), as an editor of the
    file by hand or a future `eslab users` command would."""
    users = auth.load_users(path)
    users[name] = auth.User(name, role, users[name].password_hash)
    auth.save_users(path, users)


def test_a_session_follows_the_file(tmp_path):
    path = tmp_path / "users.yaml"
    auth.add_user(path, "ed", "editor", "editor-pass")
    session = auth.signed_in(auth.load_users(path)["ed"])
    assert auth.session_user(path, session) == EDITOR
    set_role(path, "ed", "viewer")
    assert auth.session_user(path, session) == auth.User("ed", "viewer")  # demoted at once
    set_role(path, "ed", "editor")
    assert auth.session_user(path, session) == EDITOR
    auth.add_user(path, "ed", "editor", "a-new-password")  # a new password ends the session
    assert auth.session_user(path, session) is None
    session = auth.signed_in(auth.load_users(path)["ed"])
    auth.remove_user(path, "ed")
    assert auth.session_user(path, session) is None
    auth.add_user(path, "ed", "editor", "a-new-password")  # re-added: a new hash, a new salt
    assert auth.session_user(path, session) is None
    assert auth.session_user(path, EDITOR) is None  # only a login makes a session


def test_the_file_is_parsed_only_when_it_changed(tmp_path, monkeypatch):
    path = tmp_path / "users.yaml"
    auth.add_user(path, "ed", "editor", "editor-pass")
    old = time.time_ns() - 60 * 10**9
    os.utime(path, ns=(old, old))
    monkeypatch.setattr(auth, "RACY_S", 0.0)  # utime sets the ctime to now: cache anyway
    parsed = []
    load = auth.load_users
    monkeypatch.setattr(auth, "load_users", lambda p: parsed.append(p) or load(p))
    for _ in range(5):
        assert auth.cached_users(path)["ed"].role == "editor"
    assert len(parsed) == 1
    # the same size and mtime, another role: the ctime (and the inode) still tell
    set_role(path, "ed", "viewer")
    os.utime(path, ns=(old, old))
    before = len(parsed)
    assert auth.cached_users(path)["ed"].role == "viewer"
    assert auth.cached_users(path)["ed"].role == "viewer"
    assert len(parsed) == before + 1


def test_a_file_changed_just_now_is_read_again(tmp_path):
    """Two writes within the file system's timestamp granularity look the same to stat: a
    recent file is never cached, so the second write is seen."""
    path = tmp_path / "users.yaml"
    auth.add_user(path, "ed", "editor", "editor-pass")
    assert auth.cached_users(path)["ed"].is_editor
    text = path.read_text()
    stat = path.stat()
    path.write_text(text.replace("role: editor", "role: viewer"))  # in place, same size
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert not auth.cached_users(path)["ed"].is_editor


def test_a_demoted_editor_is_refused_at_the_next_action(store, dataset, tmp_path):
    run = store.search_runs(text="alpha")[0][0]
    at = as_user(EDITOR, "app_pages/run.py", run=str(run.id))
    assert at.button(key="run_cancel")  # an editor's page
    set_role(auth.auth_path(), "ed", "viewer")
    at = AppTest.from_function(
        act,
        args=(run.id, str(dataset), str(tmp_path / "o"), True),
        default_timeout=TIMEOUT,
    )
    at.session_state[auth.SESSION_KEY] = session_of(EDITOR)  # logged in as an editor
    at.run()
    assert not at.exception
    assert [e.value for e in at.error] == [f"ed is a viewer: only editors may {a}" for a in ACTIONS]
    assert store.get_run(run.id).status is RunStatus.RUNNING
    assert store.count_runs() == 2


def test_a_removed_user_is_logged_out_at_the_next_rerun(store):
    run = store.search_runs(text="alpha")[0][0]
    at = as_user(EDITOR, "app_pages/run.py", run=str(run.id))
    assert at.button(key="run_cancel")
    auth.remove_user(auth.auth_path(), "ed")
    at.button(key="run_cancel").click().run()  # the click of a page drawn before removal
    assert not at.exception
    assert store.get_run(run.id).status is RunStatus.RUNNING
    assert auth.SESSION_KEY not in at.session_state
    assert "Your session ended" in at.info[0].value
    assert at.text_input(key="login_name")  # the login form again
