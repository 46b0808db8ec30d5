"""What `eslab serve` runs with `streamlit run`: the dashboard (app/main.py) as an ASGI app
with the dataset upload route beside it, on the same address, and Streamlit's own upload
endpoint closed to tabs that have not logged in (app/upload_route.py)."""

import streamlit as st
from starlette.middleware import Middleware

from app.upload_route import ROUTES, LoginBeforeUpload

app = st.App("main.py", routes=ROUTES, middleware=[Middleware(LoginBeforeUpload)])
