"""The load benchmark's Streamlit viewer (bench/streamlit_viewer.py): what it reads from the
server's messages and what it asks for, on hand-made protobufs (no server)."""

from __future__ import annotations

import pyarrow as pa
from streamlit.proto.BackMsg_pb2 import BackMsg
from streamlit.proto.ForwardMsg_pb2 import ForwardMsg

from bench.streamlit_viewer import Viewer, rerun_request, shown_steps


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
