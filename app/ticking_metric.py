"""A metric of a duration that counts up in the browser: a live run's "Elapsed" moves every
second without a rerun. Moved by reruns on a clock instead, twenty viewers of a run reran its
status as often as its steps did, on the cores the run trains on (docs/benchmarks.md). It is
a real st.metric, so it looks like the metrics beside it; a component beside it
(live_component/ticking_metric.js) rewrites only the metric's value, every second, from the
seconds the server counted when it drew the page."""

from __future__ import annotations

from pathlib import Path

import streamlit as st

from app.views import duration

SCRIPT = Path(__file__).resolve().parent / "live_component" / "ticking_metric.js"
COMPONENT = "eslab_ticking_metric"

# in the page's own DOM (no shadow root), so that its script can reach the metric beside it
_ticker = st.components.v2.component(COMPONENT, js=SCRIPT.read_text(), isolate_styles=False)


def ticking_duration(label: str, seconds: float, *, key: str) -> None:
    """A metric `label` of `seconds` (as app.views.duration writes them) that goes on counting
    in the browser until the page redraws it; `key` names it on the page."""
    with st.container(key=key):
        st.metric(label, duration(seconds))
        _ticker(data={"seconds": seconds, "container": f"st-key-{key}"}, key=f"{key}_ticker")
