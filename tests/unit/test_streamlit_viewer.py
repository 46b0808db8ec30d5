"""The load benchmark's Streamlit viewer (bench/streamlit_viewer.py): what it reads from the
server's messages and what it asks for, on hand-made protobufs (no server)."""

from __future__ import annotations

import asyncio
import json

import pyarrow as pa
import pytest
from streamlit.proto.BackMsg_pb2 import BackMsg
from streamlit.proto.ForwardMsg_pb2 import ForwardMsg

from app.version_watch import COMPONENT
from bench.streamlit_viewer import Viewer, drawn_watch, in_order, rerun_request, shown_steps


def metric(label: str, body: str, hash_: str = "") -> ForwardMsg:
    msg = ForwardMsg(hash=hash_)
    msg.delta.new_element.metric.label = label
    msg.delta.new_element.metric.body = body
    return msg


def table(steps: list[str]) -> ForwardMsg:
    sink = pa.BufferOutputStream()
    data = pa.table({"name": ["a"] * len(steps), "step": steps})
    with pa.ipc.new_stream(sink, data.schema) as writer:
        writer.write_table(data)
    msg = ForwardMsg()
    msg.delta.new_element.dataframe.arrow_data.data = sink.getvalue().to_pybytes()
    return msg


def test_steps_come_from_the_step_metric_and_the_step_column_only():
    assert shown_steps(metric("Step", "12 / 100")) == [12]
    assert shown_steps(metric("Step", "3 / ?")) == [3]
    assert shown_steps(metric("Elapsed", "12 / 100")) == []
    assert shown_steps(table(["7 / 20", "0 / ?", ""])) == [7, 0]
    assert shown_steps(ForwardMsg(script_finished=1)) == []


def test_a_timed_rerun_names_its_fragment_and_the_page():
    msg = BackMsg()
    msg.ParseFromString(rerun_request("run", "run=4", "abc", "frag1", ["h1"]))
    state = msg.rerun_script
    assert (state.page_name, state.query_string, state.page_script_hash) == ("run", "run=4", "abc")
    assert (state.fragment_id, state.is_auto_rerun) == ("frag1", True)
    assert list(state.cached_message_hashes) == ["h1"]
    msg.ParseFromString(rerun_request("", ""))
    assert not msg.rerun_script.is_auto_rerun and not msg.rerun_script.fragment_id


def test_a_message_sent_by_reference_is_read_from_the_viewers_copy():
    seen: list[tuple[int, float]] = []
    viewer = Viewer("ws://x", "run", "run=1", lambda step, at: seen.append((step, at)))
    session = ForwardMsg()
    session.new_session.page_script_hash = "page-hash"
    viewer.handle(session, 1.0)
    viewer.handle(metric("Step", "5 / 9", hash_="h5"), 2.0)
    viewer.handle(ForwardMsg(ref_hash="h5"), 3.0)
    viewer.handle(ForwardMsg(ref_hash="unknown"), 4.0)
    assert viewer.page_hash == "page-hash"
    assert seen == [(5, 2.0), (5, 3.0)]
    assert list(viewer.cache) == ["h5"]


def watch(component: str, fragment: str, order: int = 0) -> ForwardMsg:
    """A version watch as the server draws it (app/version_watch.py)."""
    msg = ForwardMsg()
    msg.delta.fragment_id = fragment
    element = msg.delta.new_element.bidi_component
    element.id, element.component_name = component, COMPONENT
    data = {"url": "/api/live/run/1", "ticket": "t", "state": "|1:running:3:0:0"}
    element.json = json.dumps({**data, "order": order, "retry_ms": 1000})
    return msg


def test_a_watch_reruns_its_fragment_with_the_trigger_a_browser_sends():
    charts = drawn_watch(watch("$$ID-b-charts_watch", "frag2"), run=1)
    assert charts is not None and charts.fragment == "frag2" and charts.retry_s == 1.0
    assert charts.changed({"state": "|1:running:3:0:0"}) is None and charts.changed(None) is None
    assert charts.changed({"state": "|1:running:4:0:0"}) == "|1:running:4:0:0"
    assert charts.changed({"expired": True}) == "expired"
    assert drawn_watch(metric("Step", "1 / 2"), run=1) is None
    msg = BackMsg()
    msg.ParseFromString(rerun_request("run", "run=1", "abc", "frag2", (), ("$$ID-b", "v")))
    state = msg.rerun_script
    assert (state.fragment_id, state.is_auto_rerun) == ("frag2", False)
    (widget,) = state.widget_states.widgets
    assert widget.id == "$$STREAMLIT_INTERNAL_KEY_$$ID-b__events"  # as Chromium sends it
    assert json.loads(widget.json_trigger_value) == [{"event": "changed", "value": "v"}]


def test_a_whole_page_drawn_without_a_watch_drops_it():
    viewer = Viewer("ws://x", "run", "run=1", lambda step, at: None)
    session = ForwardMsg()
    session.new_session.page_script_hash = "page-hash"
    viewer.handle(session, 1.0)
    viewer.handle(watch("$$ID-a", "frag1"), 1.0)
    viewer.handle(ForwardMsg(script_finished=ForwardMsg.FINISHED_SUCCESSFULLY), 1.0)
    assert list(viewer.watches) == ["$$ID-a"]
    viewer.handle(session, 2.0)  # the fragment reruns: its watch stays
    viewer.handle(ForwardMsg(script_finished=ForwardMsg.FINISHED_FRAGMENT_RUN_SUCCESSFULLY), 2.0)
    assert list(viewer.watches) == ["$$ID-a"]
    viewer.handle(session, 3.0)  # the run ended: the page is drawn again, without a watch
    viewer.handle(ForwardMsg(script_finished=ForwardMsg.FINISHED_SUCCESSFULLY), 3.0)
    assert viewer.watches == {}


class Server:
    """The websocket of a viewer's session: it keeps what the viewer sends and finishes each
    fragment's run at once."""

    def __init__(self, viewer: Viewer) -> None:
        self.viewer = viewer
        self.reruns: list[str] = []  # the fragment of each rerun asked for

    async def send(self, data: bytes) -> None:
        msg = BackMsg()
        msg.ParseFromString(data)
        self.reruns.append(msg.rerun_script.fragment_id)
        self.viewer.handle(ForwardMsg(script_finished=ForwardMsg.FINISHED_SUCCESSFULLY), 0.0)


def test_the_status_reruns_before_the_charts_when_both_see_a_step():
    """The charts' watch drawn first, as the page may draw them: the status, which shows the
    step, still reruns first, as in the browser; each once, and not again for the same
    version."""
    viewer = Viewer("ws://x", "run", "run=1", lambda step, at: None)
    viewer.handle(watch("$$ID-b-charts_watch", "charts", order=1), 1.0)
    viewer.handle(watch("$$ID-a-status_watch", "status", order=0), 1.0)
    server = Server(viewer)
    stepped = {"/api/live/run/1": {"state": "|1:running:4:0:0"}}
    asyncio.run(viewer.trigger(server, stepped))
    asyncio.run(viewer.trigger(server, stepped))
    assert server.reruns == ["status", "charts"]
    assert [w.fragment for w in in_order(viewer.watches.values())] == ["status", "charts"]


class Done(Exception):
    """The route has no more answers for the test."""


def test_the_viewer_asks_since_the_version_it_knows_and_at_once_when_a_watch_is_behind():
    """As the script: each ask names the version answered last, which the route holds until
    it changes; a watch drawn from another version makes the next ask immediate (no
    `since`), and a refused ticket reruns the fragment for a new one."""
    viewer = Viewer("ws://x", "run", "run=1", lambda step, at: None)
    viewer.handle(watch("$$ID-a-status_watch", "status"), 1.0)  # drawn at |1:running:3:0:0
    server = Server(viewer)
    answers = iter([{"state": "|1:running:3:0:0"}, {"state": "|1:running:4:0:0"}, {"expired": 1}])
    asked: list[str | None] = []

    async def ask(http, watch, since: str | None) -> dict | None:
        asked.append(since)
        answer = next(answers, None)
        if answer is None:
            raise Done
        return answer

    viewer._ask = ask
    with pytest.raises(Done):
        asyncio.run(viewer._watch_versions(server, http=None))
    drawn = "|1:running:3:0:0"
    assert asked == [drawn, drawn, None, None]  # the held time ran out; a step; behind
    assert server.reruns == ["status", "status"]  # for the step, then for a new ticket
