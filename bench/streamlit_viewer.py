"""One viewer of the dashboard that speaks Streamlit's own websocket protocol instead of
running a browser: it opens /_stcore/stream, asks for a page (a BackMsg rerun_script with
the page's name and query string), does what the page's version watches do in a browser
(app/version_watch.py: ask the live route for the version, a request it holds until the
version changes, rerun the watch's fragment with a trigger when the answer differs from the
version drawn), reruns each fragment on the timer the server asks for (ForwardMsg
auto_rerun), and reports each run step it is shown.

The server does the same work for it as for a browser (route answers, script runs, element
encoding, sending), while the viewer's side costs a protobuf parse per message and a small
HTTP request per change of the page (or per version_wait.HOLD_SECONDS): a load test of many
viewers then measures the dashboard, not the browsers' rendering."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import pyarrow as pa
from streamlit.proto.BackMsg_pb2 import BackMsg
from streamlit.proto.ForwardMsg_pb2 import ForwardMsg

from app.version_watch import CHANGED, COMPONENT

STEP = re.compile(r"^\s*(\d+)\s*/")
"""A step count as the Run page's "Step" metric and the Runs page's "step" column show it:
`12 / 100` (or `12 / ?`)."""
CACHED_MESSAGES = 100
"""How many messages a viewer keeps to be sent by reference (the browser keeps recent ones)."""
TRIGGER_ID = "$$STREAMLIT_INTERNAL_KEY_{component}__events"
"""The widget whose value carries a component's trigger events, as Streamlit's frontend names
it (streamlit.components.v2.bidi_component.main._make_trigger_id)."""
UNAUTHORIZED = 401
REDRAW_WAIT_S = 5.0
"""How long a trigger waits for the fragment of the one before it to be redrawn, as
version_watch.js's REDRAW_WAIT_MS: a fragment rerun asked for while another runs may leave
that one undrawn."""


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


@dataclass
class Watch:
    """A version watch as a page drew it: the fragment it reruns and what its script was
    given (the route's address and ticket, the version drawn), and the version it last asked
    a rerun for (asked once, as the script does)."""

    component: str
    fragment: str
    run: int
    url: str
    ticket: str
    state: str
    order: int
    retry_s: float
    asked: str | None = None

    def changed(self, answer: dict | None) -> str | None:
        """The version to rerun for, as the script decides it (version_watch.js, differs):
        None while the route answers the version drawn, or did not answer."""
        if answer is None:
            return None
        if answer.get("expired"):
            return "expired"
        return None if answer["state"] == self.state else answer["state"]


def in_order(watches: Iterable[Watch]) -> list[Watch]:
    """`watches` in the order their fragments rerun when they see the same change, as the
    script orders them (version_watch.js): the one that shows a run's step first."""
    return sorted(watches, key=lambda w: w.order)


def drawn_watch(msg: ForwardMsg, run: int) -> Watch | None:
    """The version watch that `msg` draws, in the page's `run`-th script run; None for any
    other message."""
    if msg.WhichOneof("type") != "delta" or msg.delta.WhichOneof("type") != "new_element":
        return None
    element = msg.delta.new_element
    if element.WhichOneof("type") != "bidi_component":
        return None
    component = element.bidi_component
    if component.component_name != COMPONENT:
        return None
    data = json.loads(component.json or component.mixed.json)
    return Watch(
        component.id,
        msg.delta.fragment_id,
        run,
        data["url"],
        data["ticket"],
        data["state"],
        data["order"],
        data["retry_ms"] / 1000,
    )


def rerun_request(
    page: str,
    query: str,
    page_hash: str = "",
    fragment: str = "",
    cached: Iterable[str] = (),
    trigger: tuple[str, str] | None = None,
) -> bytes:
    """The BackMsg a browser sends to run `page` (its URL path, "" for the default page) with
    `query` (the URL's query string without "?"), or only its `fragment`: on a timer, or for
    the `trigger` (component id, value) of a version watch in it."""
    msg = BackMsg()
    state = msg.rerun_script
    state.query_string = query
    state.page_name = page
    state.page_script_hash = page_hash
    if fragment:
        state.fragment_id = fragment
        state.is_auto_rerun = trigger is None
    if trigger is not None:
        component, value = trigger
        widget = state.widget_states.widgets.add()
        widget.id = TRIGGER_ID.format(component=component)
        widget.json_trigger_value = json.dumps([{"event": CHANGED, "value": value}])
    state.cached_message_hashes.extend(cached)
    return msg.SerializeToString()


class Viewer:
    """One session of `page`?`query` on the dashboard at `ws_url` (ws://HOST:PORT); calls
    `on_step(step, seconds)` (time.time()) each time a message shows a step count."""

    def __init__(
        self, ws_url: str, page: str, query: str, on_step: Callable[[int, float], None]
    ) -> None:
        self.url = f"{ws_url}/_stcore/stream"
        self.http_url = "http" + ws_url.removeprefix("ws")
        self.page = page
        self.query = query
        self.on_step = on_step
        self.page_hash = ""
        self.cache: dict[str, ForwardMsg] = {}  # what a browser keeps: messages by hash
        self.timers: dict[str, asyncio.Task] = {}
        self.watches: dict[str, Watch] = {}  # by component id
        self.runs = 0  # script runs begun (full or fragment), to drop watches no longer drawn
        self.finished = asyncio.Event()  # set when a script run finishes
        self.watch_drawn = asyncio.Event()  # set when a version watch is drawn
        self.messages = 0
        self.errors = 0

    async def run(self, stop: asyncio.Event) -> None:
        """Views the page until `stop` is set; reconnects (as a browser does) if dropped."""
        import aiohttp
        import websockets

        while not stop.is_set():
            try:
                async with (
                    websockets.connect(
                        self.url, subprotocols=["streamlit"], max_size=None, open_timeout=60
                    ) as ws,
                    aiohttp.ClientSession() as http,
                ):
                    await ws.send(rerun_request(self.page, self.query))
                    tasks = {
                        asyncio.ensure_future(self._receive(ws)),
                        asyncio.ensure_future(self._watch_versions(ws, http)),
                    }
                    waiter = asyncio.ensure_future(stop.wait())
                    done, _ = await asyncio.wait(
                        {*tasks, waiter}, return_when=asyncio.FIRST_COMPLETED
                    )
                    for task in (*tasks, waiter, *self.timers.values()):
                        task.cancel()
                    self.timers.clear()
                    self.watches.clear()
                    for task in done & tasks:
                        if not task.cancelled() and task.exception():
                            raise task.exception()
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
        page, its version watches and fragment timers, and report the steps it shows."""
        msg = self._kept(msg)
        kind = msg.WhichOneof("type")
        if kind == "new_session":
            self.page_hash = msg.new_session.page_script_hash
            self.runs += 1
        elif kind == "script_finished":
            self.finished.set()
            if msg.script_finished == ForwardMsg.FINISHED_SUCCESSFULLY:
                # a whole page drawn: the watches it did not draw are gone from it
                self.watches = {k: w for k, w in self.watches.items() if w.run == self.runs}
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
        if watch := drawn_watch(msg, self.runs):
            self.watches[watch.component] = watch
            self.watch_drawn.set()
        for step in shown_steps(msg):
            self.on_step(step, now)

    def _kept(self, msg: ForwardMsg) -> ForwardMsg:
        """`msg`, kept by its hash; for a reference to a message kept before, that one."""
        if msg.WhichOneof("type") == "ref_hash":
            return self.cache.get(msg.ref_hash, msg)
        if msg.hash:
            self.cache[msg.hash] = msg
            while len(self.cache) > CACHED_MESSAGES:  # the oldest go first, as in a browser
                del self.cache[next(iter(self.cache))]
        return msg

    async def _watch_versions(self, ws, http) -> None:
        """The page's version watches, as the script runs them: one request at a time for
        all of them (a live page's watches share one address), which the route holds until
        the version differs from the one it answered last (at once when a watch was drawn
        from another), then their triggers, and the next request."""
        known: str | None = None
        while True:
            watches = in_order(self.watches.values())
            if not watches:
                self.watch_drawn.clear()
                await self.watch_drawn.wait()
                continue
            known = watches[0].state if known is None else known
            since = known if all(w.state == known for w in watches) else None
            answer = await self._ask(http, watches[0], since)
            await self.trigger(ws, {watches[0].url: answer})
            if answer is None or "state" not in answer:
                await asyncio.sleep(watches[0].retry_s)
            else:
                known = answer["state"]

    async def trigger(self, ws, answers: dict[str, dict | None]) -> None:
        """A trigger per watch whose version differs from the route's answer at its address
        (`answers`), in their order, each after the run of the one before it finished (or
        REDRAW_WAIT_S)."""
        for watch in in_order(self.watches.values()):
            changed = watch.changed(answers.get(watch.url))
            if changed and changed != watch.asked:
                watch.asked = changed
                trigger = (watch.component, changed)
                request = rerun_request(
                    self.page, self.query, self.page_hash, watch.fragment, self.cache, trigger
                )
                self.finished.clear()
                await ws.send(request)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.finished.wait(), REDRAW_WAIT_S)

    async def _ask(self, http, watch: Watch, since: str | None) -> dict | None:
        """The route's answer to `watch`'s script, once the version differs from `since`
        (at once when None): its JSON, `expired` on a 401, None when it cannot be had (the
        script asks again after a while)."""
        headers = {"Authorization": f"Bearer {watch.ticket}"}
        url = self.http_url + watch.url if watch.url.startswith("/") else watch.url
        params = {} if since is None else {"since": since}
        try:
            async with http.get(url, headers=headers, params=params) as response:
                if response.status == UNAUTHORIZED:
                    return {"expired": True}
                return await response.json() if response.ok else None
        except Exception:  # the dashboard is restarting: as the script, ask again
            return None

    async def _rerun_every(self, ws, fragment: str, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            request = rerun_request(self.page, self.query, self.page_hash, fragment, self.cache)
            await ws.send(request)
