"""What `eslab serve` runs with `streamlit run`: the dashboard (app/main.py) as an ASGI app
with the routes beside it, on the same address: the dataset upload (app/upload_route.py),
the checkpoint download (app/checkpoint_route.py) and the live pages' versions
(app/live_route.py); Streamlit's own upload endpoint is
closed to tabs that have not logged in (app/upload_route.py)."""

import streamlit as st
from starlette.middleware import Middleware

from app import checkpoint_route, live_route, upload_route

app = st.App(
    "main.py",
    routes=[*upload_route.ROUTES, *checkpoint_route.ROUTES, *live_route.ROUTES],
    middleware=[Middleware(upload_route.LoginBeforeUpload)],
)
