"""A live page's watch on its version: an invisible component, placed in a fragment, whose
script (live_component/version_watch.js) asks the live route (app/live_route.py) whether
what the fragment shows changed, a request the route holds until it did (a long poll), and
reruns the fragment (a trigger: a widget's event in a fragment reruns only it) when it did.
It replaces a timer on the fragment: between two steps of a run, nothing runs on the
dashboard but the route's shared read of the version, however many viewers watch."""

from __future__ import annotations

from pathlib import Path

import streamlit as st

from app import live, tickets
from app.views import page_origin, tab_ticket

SCRIPT = Path(__file__).resolve().parent / "live_component" / "version_watch.js"
COMPONENT = "eslab_version_watch"
CHANGED = "changed"
"""The trigger's event, as the script sends it: its value (the new version) is not read,
only the rerun it causes matters."""
RETRY_SECONDS = 1.0
"""How long a page waits before asking again when the route did not answer (the dashboard
restarting) or refused its ticket (until the rerun that this asks for brings a new one)."""

_watch = st.components.v2.component(COMPONENT, js=SCRIPT.read_text())


def watch_version(
    path: str, subject: str, version: live.Version, *, key: str, order: int = 0
) -> None:
    """Reruns the calling fragment once the route at `path` (for a ticket bound to
    `subject`) answers other than `version`; `key` names the watch, one per fragment of a
    page. Of a page's watches that see the same change, the lowest `order` reruns its
    fragment first: the one that shows what a viewer waits for (a run's step)."""
    _watch(
        data={
            "url": page_origin() + path,
            "ticket": tab_ticket(tickets.LIVE, subject),
            "state": version.state,
            "order": order,
            "retry_ms": int(RETRY_SECONDS * 1000),
        },
        key=key,
    )
