"""One viewer of the dashboard that speaks Streamlit's own websocket protocol instead of
running a browser: it opens /_stcore/stream, asks for a page (a BackMsg rerun_script with
the page's name and query string), reruns each fragment on the timer the server asks for
(ForwardMsg auto_rerun), as the browser does, and reports each run step it is shown.

The server does the same work for it as for a browser (script runs, element encoding,
sending), while the viewer's side costs a protobuf parse per message: a load test of many
viewers then measures the dashboard, not the browsers' rendering."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable, Iterable

import pyarrow as pa
from streamlit.proto.BackMsg_pb2 import BackMsg
from streamlit.proto.ForwardMsg_pb2 import ForwardMsg

STEP = re.compile(r"^\s*(\d+)\s*/")
"""A step count as the Run page's "Step" metric and the Runs page's "step" column show it:
`12 / 100` (or `12 / ?`)."""
CACHED_MESSAGES = 100
"""How many messages a viewer keeps to be sent by reference (the browser keeps recent ones)."""


def shown_steps(msg: ForwardMsg) -> list[int]:
    """The step counts that a ForwardMsg shows: the value of a metric labelled "Step" or the
    cells of a table's "step" column; none for any other message."""
    if msg.WhichOneof("type") != "delta" or msg.delta.WhichOneof("type") != "new_element":
        return []
    element = msg.delta.new_element
    kind = element.WhichOneof("type")
    if kind == "metric" and element.metric.label == "Step":
        return _steps([element.metric.body])
    if kind == "dataframe" and element.dataframe.arrow_data.data:
        table = pa.ipc.open_stream(element.dataframe.arrow_data.data).read_all()
        if "step" in table.column_names:
            return _steps(str(v) for v in table.column("step").to_pylist())
    return []


def _steps(texts: Iterable[str]) -> list[int]:
    return [int(m.group(1)) for text in texts if (m := STEP.match(text))]


def rerun_request(
    page: str, query: str, page_hash: str = "", fragment: str = "", cached: Iterable[str] = ()
) -> bytes:
    """The BackMsg a browser sends to run `page` (its URL path, "" for the default page) with
    `query` (the URL's query string without "?"), or only its `fragment` on a timer."""
    msg = BackMsg()
    state = msg.rerun_script
    state.query_string = query
    state.page_name = page
    state.page_script_hash = page_hash
    if fragment:
        state.fragment_id = fragment
        state.is_auto_rerun = True
    state.cached_message_hashes.extend(cached)
    return msg.SerializeToString()


class Viewer:
    """One session of `page`?`query` on the dashboard at `ws_url` (ws://HOST:PORT); calls
    `on_step(step, seconds)` (time.time()) each time a message shows a step count."""

    def __init__(
        self, ws_url: str, page: str, query: str, on_step: Callable[[int, float], None]
    ) -> None:
        self.url = f"{ws_url}/_stcore/stream"
        self.page = page
        self.query = query
        self.on_step = on_step
        self.page_hash = ""
        self.cache: dict[str, ForwardMsg] = {}  # what a browser keeps: messages by hash
        self.timers: dict[str, asyncio.Task] = {}
        self.messages = 0
        self.errors = 0

    async def run(self, stop: asyncio.Event) -> None:
        """Views the page until `stop` is set; reconnects (as a browser does) if dropped."""
        import websockets

        while not stop.is_set():
            try:
                async with websockets.connect(
                    self.url, subprotocols=["streamlit"], max_size=None, open_timeout=60
                ) as ws:
                    await ws.send(rerun_request(self.page, self.query))
                    receiver = asyncio.ensure_future(self._receive(ws))
                    waiter = asyncio.ensure_future(stop.wait())
                    await asyncio.wait({receiver, waiter}, return_when=asyncio.FIRST_COMPLETED)
                    for task in (receiver, waiter, *self.timers.values()):
                        task.cancel()
                    self.timers.clear()
                    if receiver.done() and not receiver.cancelled() and receiver.exception():
                        raise receiver.exception()
            except Exception:  # a dropped or refused connection: counted, retried
                if stop.is_set():
                    return
                self.errors += 1
                await asyncio.sleep(1)

    async def _receive(self, ws) -> None:
        async for data in ws:
            now = time.time()
            msg = ForwardMsg()
            msg.ParseFromString(data)
            self.messages += 1
            self.handle(msg, now, ws)

    def handle(self, msg: ForwardMsg, now: float, ws=None) -> None:
        """What the browser does with `msg` that matters here: keep it by hash, follow its
        page and fragment timers, and report the steps it shows."""
        kind = msg.WhichOneof("type")
        if kind == "ref_hash":  # a message this viewer said it had: the kept copy
            msg = self.cache.get(msg.ref_hash, msg)
            kind = msg.WhichOneof("type")
        elif msg.hash:
            self.cache[msg.hash] = msg
            while len(self.cache) > CACHED_MESSAGES:  # the oldest go first, as in a browser
                del self.cache[next(iter(self.cache))]
        if kind == "new_session":
            self.page_hash = msg.new_session.page_script_hash
        elif kind == "auto_rerun" and ws is not None:
            fragment = msg.auto_rerun.fragment_id
            if fragment in self.timers:
                self.timers[fragment].cancel()
            self.timers[fragment] = asyncio.ensure_future(
                self._rerun_every(ws, fragment, msg.auto_rerun.interval)
            )
        elif kind == "stop_auto_rerun":
            for fragment in msg.stop_auto_rerun.fragment_ids:
                if task := self.timers.pop(fragment, None):
                    task.cancel()
        for step in shown_steps(msg):
            self.on_step(step, now)

    async def _rerun_every(self, ws, fragment: str, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            request = rerun_request(self.page, self.query, self.page_hash, fragment, self.cache)
            await ws.send(request)
