"""The login form and the sidebar's "signed in as" line, shown by app/main.py when
ESLAB_AUTH_FILE is set. The user lives in st.session_state: a reload or a new tab asks
again (the URL, and so the view, survives the login)."""

from __future__ import annotations

import streamlit as st

from app import auth


def login_gate() -> auth.User | None:
    """The logged-in user, or None after drawing the login form (the caller stops)."""
    path = auth.auth_path()
    if path is None:
        return auth.LOCAL_USER
    user = st.session_state.get(auth.SESSION_KEY)
    if user is not None:
        return user
    try:
        users = auth.load_users(path)
    except auth.AuthError as exc:
        st.error(str(exc))
        return None
    st.title("ES Lab")
    with st.form("login"):
        st.subheader("Log in")
        name = st.text_input("User name", key="login_name")
        password = st.text_input("Password", type="password", key="login_password")
        submitted = st.form_submit_button("Log in", type="primary")
    if submitted:
        user = auth.authenticate(users, name.strip(), password)
        if user is None:
            st.error("Unknown user name or wrong password.")
        else:
            st.session_state[auth.SESSION_KEY] = auth.User(user.name, user.role)  # no hash
            st.rerun()
    if not users:
        st.warning(f"{path} has no users yet: add one with `eslab users add NAME --role editor`.")
    return None


def sidebar(user: auth.User) -> None:
    """Who is signed in, and a logout, when logins are on."""
    if auth.auth_path() is None:
        return
    with st.sidebar:
        st.caption(f"Signed in as **{user.name}** ({user.role})")
        if st.button("Log out", icon=":material/logout:", key="logout"):
            st.session_state.pop(auth.SESSION_KEY, None)
            st.rerun()
