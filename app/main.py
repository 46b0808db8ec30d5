"""The dashboard's entry file: declares the pages and the shared sidebar (`eslab serve` runs
it with Streamlit). Every page keeps its state in the URL, so a copied link is the view.
With ESLAB_AUTH_FILE set, nothing but the login form shows until a user logs in."""

import streamlit as st

from app.login import login_gate, sidebar

st.set_page_config(page_title="ES Lab", layout="wide")
pages = [
    st.Page("app_pages/runs.py", title="Runs", icon=":material/list:", default=True),
    st.Page("app_pages/sweeps.py", title="Sweeps", icon=":material/tune:", url_path="sweeps"),
    st.Page("app_pages/new_run.py", title="New run", icon=":material/add:", url_path="new"),
    st.Page("app_pages/run.py", title="Run", icon=":material/monitoring:", url_path="run"),
    st.Page("app_pages/sweep.py", title="Sweep", icon=":material/insights:", url_path="sweep"),
    st.Page("app_pages/compare.py", title="Compare", icon=":material/compare:", url_path="compare"),
    st.Page("app_pages/samples.py", title="Samples", icon=":material/article:", url_path="samples"),
]
user = login_gate()
if user is None:
    st.navigation(pages, position="hidden")  # keeps the URL's page and query for after login
    st.stop()
page = st.navigation(pages)
sidebar(user)
page.run()
