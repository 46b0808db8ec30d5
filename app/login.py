"""The login form and the sidebar's "signed in as" line, shown by app/main.py when
ESLAB_AUTH_FILE is set. The session lives in st.session_state: a reload or a new tab asks
again (the URL, and so the view, survives the login). Failed logins slow down per user name
and per client (app/login_throttle.py).

"Client" is the address Streamlit reports for the tab's connection (st.context.ip_address):
the peer of the WebSocket, or the X-Forwarded-For address when the peer is one of the
proxies the operator lists in ESLAB_TRUSTED_PROXIES (uvicorn, which serves Streamlit, reads
those headers from the addresses of FORWARDED_ALLOW_IPS, which `eslab serve` sets from that
setting: by default none, since any local account could otherwise claim to be any address).
Streamlit reports None for this machine itself, so every local tab is one client, "local";
behind a proxy that is not listed, every visitor is that proxy, and only the per-name counts
tell them apart."""

from __future__ import annotations

import math

import streamlit as st

from app import auth
from app.login_throttle import THROTTLE, hash_slot
from app.views import inert

LOCAL_CLIENT = "local"


def login_gate() -> auth.User | None:
    """The logged-in user, or None after drawing the login form (the caller stops)."""
    path = auth.auth_path()
    if path is None:
        return auth.LOCAL_USER
    try:
        users = auth.cached_users(path)
    except auth.AuthError as exc:
        st.error(str(exc))
        return None
    had_session = auth.SESSION_KEY in st.session_state
    user = auth.current_user()
    if user is not None:
        return user
    st.title("ES Lab")
    if had_session:
        st.info("Your session ended: your account was removed or its password changed.")
    with st.form("login"):
        st.subheader("Log in")
        name = st.text_input("User name", key="login_name")
        password = st.text_input("Password", type="password", key="login_password")
        submitted = st.form_submit_button("Log in", type="primary")
    if submitted:
        _log_in(users, name.strip(), password)
    if not users:
        st.warning(f"{path} has no users yet: add one with `eslab users add NAME --role editor`.")
    return None


def _log_in(users: dict[str, auth.User], name: str, password: str) -> None:
    """Check one attempt, unless the throttle says to wait or every hashing slot is taken
    (both before the password is hashed); on success the tab is signed in and the page runs
    again."""
    client = st.context.ip_address or LOCAL_CLIENT
    with hash_slot() as free:
        if not free:  # refused before counting or hashing anything
            st.error("The server is busy with other logins: try again in a few seconds.")
            return
        wait = THROTTLE.attempt(name, client)
        if wait > 0:
            st.error(f"Too many failed logins: try again in {math.ceil(wait)} s.")
            return
        user = auth.authenticate(users, name, password)
    if user is None:
        st.error("Unknown user name or wrong password.")
        return
    THROTTLE.succeeded(name, client)
    st.session_state[auth.SESSION_KEY] = auth.signed_in(user)
    st.rerun()


def sidebar(user: auth.User) -> None:
    """Who is signed in, and a logout, when logins are on."""
    if auth.auth_path() is None:
        return
    with st.sidebar:
        st.caption(f"Signed in as **{inert(user.name)}** ({user.role})")
        if st.button("Log out", icon=":material/logout:", key="logout"):
            st.session_state.pop(auth.SESSION_KEY, None)
            st.rerun()
