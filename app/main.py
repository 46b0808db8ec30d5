"""The dashboard's entry file: declares the pages and the shared sidebar (`eslab serve` runs
it with Streamlit)."""

import streamlit as st

st.set_page_config(page_title="ES Lab", layout="wide")
page = st.navigation([st.Page("app_pages/runs.py", title="Runs", default=True)])
page.run()
