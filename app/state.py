"""Resources the pages share across reruns."""

import streamlit as st

from jobs.store.store import Store


@st.cache_resource
def get_store() -> Store:
    return Store()
