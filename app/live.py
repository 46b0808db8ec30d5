"""What the live pages (Run, Runs, Sweep, Sweeps) read, read once for all their viewers, and
the versions that tell a viewer's page when to read it again.

A live page redraws only when what it shows changed: each of its live fragments carries a
component (app/version_watch.py) that asks the dashboard's route (app/live_route.py) for
the Version of what the page shows, which the route holds until it differs from the one the
page has (app/version_wait.py), and reruns the fragment when that differs from the one it
was drawn with. A version is a few numbers per run shown (status,
step, events written, whether the worker is silent: RunSign), with what else the page lists
(how many runs; a sweep's status); nothing in it moves with the clock alone (a run's elapsed
time counts in the browser: app/ticking_metric.py). The route's read of it is shared by
every viewer for FRESH_SECONDS. On timers instead, twenty viewers reran twenty fragments a
second between steps twenty-five seconds apart, on the cores the run trains on
(bench/dashboard_load.py measured it).

Were each rerun to read the database and encode its charts itself, twenty viewers of one run
would make the dashboard read the same rows and build the same Vega-Lite specs twenty times
over. Here a run's state is read at most once per FRESH_SECONDS for everyone (Streamlit
computes a missing entry once while other sessions wait for it), a run's charts are built
once per recorded step, as Vega-Lite specs that each viewer only sends, and the Runs page's
rows, a sweep's table and chart and the Sweeps page's table once per version of the page:
read after it, so that they are at least as new as the version a viewer is drawn with. An
action that changes a run (cancel, resume, delete) calls `forget`, one that changes a sweep
`forget_sweep`, so that its own page shows the change at once.

Everything here is shared between sessions: callers must not change what they are given."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import pandas as pd
import pyarrow as pa
import streamlit as st
from streamlit import dataframe_util

from app import run_charts, sweep_view
from app.state import get_store
from app.views import MISSING, mode, model_name, progress, task_name
from engine import metrics as mk
from jobs.liveness import silent_since
from jobs.phases import phase_of, status_text
from jobs.scheduler import SchedulerSettings
from jobs.store.records import EventRecord, RunRecord, RunSign, SweepRecord
from jobs.store.status import SweepStatus
from jobs.sweeps.driver import sweep_table
from jobs.sweeps.spec import SweepSpec

POLL_SECONDS = 0.5
"""How often the version of a page that viewers wait on is read (app/version_wait.py): a
new step shows within this plus FRESH_SECONDS (and the rerun that draws it)."""
FRESH_SECONDS = 0.5
"""How old a shared read may be when a viewer is shown it."""
CHART_ENTRIES = 64
"""Runs' chart sets kept (one per run, x-axis and smoothing shown): each is a few hundred
KB, so memory stays bounded however long the dashboard runs."""
SWEEP_FRESH_SECONDS = 2.5
"""How long a shared read of a sweep is kept: a sweep's table is a query per run, and its
chart is built from it, so it is read once per version of the sweep for all viewers."""
HEARTBEAT_TIMEOUT = SchedulerSettings.from_env().heartbeat_timeout_seconds


@dataclass(frozen=True)
class Version:
    """What a live page shows, in short: `state` changes with a run's status, step, events
    or worker's silence (and, for the Runs page, with a run added or deleted)."""

    state: str


def version_of(signs: Sequence[RunSign], now: datetime, listing: str = "") -> Version:
    """The version of a page that shows runs `signs` as of the database's time `now`;
    `listing` is what else it shows that may change (the Runs page: how many runs)."""
    parts = [listing] + [
        f"{s.id}:{s.status.value}:{s.step}:{s.events}:{int(_silent(s, now))}" for s in signs
    ]
    return Version("|".join(parts))


def _silent(sign: RunSign, now: datetime) -> bool:
    """Whether the Run page would warn of a silent worker (it asks the same question)."""
    return silent_since(sign, HEARTBEAT_TIMEOUT, now) is not None


@dataclass(frozen=True)
class RunState:
    """A run as its live page shows it: the record, its events, and the database's time."""

    run: RunRecord
    events: tuple[EventRecord, ...]
    now: datetime

    @property
    def version(self) -> Version:
        """The version of exactly this state, which the route answers until it changes."""
        r = self.run
        sign = RunSign(r.id, r.status, r.step, len(self.events), r.started_at, r.heartbeat_at)
        return version_of([sign], self.now)


@st.cache_resource(ttl=FRESH_SECONDS, max_entries=1000, show_spinner=False)
def run_version(run_id: int) -> Version:
    """The version of run `run_id`'s live page, as its route answers every viewer."""
    signs = get_store().run_signs([run_id])
    return version_of(signs.runs, signs.now)


@st.cache_resource(ttl=FRESH_SECONDS, max_entries=1, show_spinner=False)
def runs_version() -> Version:
    """The version of the Runs page: every run not over, and how many runs there are."""
    signs = get_store().run_signs()
    return version_of(signs.runs, signs.now, f"{signs.count}:{signs.newest}")


@dataclass(frozen=True)
class RunFilters:
    """The Runs page's filters (its URL's query), one page of PAGE_SIZE rows."""

    text: str = ""
    statuses: tuple[str, ...] = ()
    methods: tuple[str, ...] = ()
    tag: str = ""
    order: str = "-created_at"
    limit: int = 50
    offset: int = 0


@dataclass(frozen=True)
class RunsListing:
    """One page of runs, how many match in all, and the table that shows them: an Arrow
    table, which st.dataframe only serializes (a DataFrame it would convert on every redraw,
    half the Runs page's rerun under 20 viewers)."""

    runs: tuple[RunRecord, ...]
    total: int
    table: pa.Table


@st.cache_resource(ttl=FRESH_SECONDS, max_entries=1000, show_spinner=False)
def run_state(run_id: int) -> RunState:
    store = get_store()
    return RunState(store.get_run(run_id), tuple(store.events(run_id)), store.database_now())


@st.cache_resource(max_entries=CHART_ENTRIES, show_spinner=False)
def run_charts_at(
    run_id: int, step: int, status: str, x: str, smoothing: float, _run: RunRecord
) -> tuple[dict | None, tuple[dict, ...]]:
    """The Vega-Lite specs of a run's population chart (None before its first step) and of
    its metric charts, as of `step` and `status` (the key: a new step builds them anew)."""
    store = get_store()
    population = run_charts.population(store, _run)
    figures = run_charts.metric_figures(store, _run, x, smoothing)
    return (
        None if population is None else sendable(population.to_dict()),
        tuple(sendable(f.to_dict()) for f in figures),
    )


def sendable(spec: dict) -> dict:
    """`spec` with its datasets as Arrow bytes, the form in which Streamlit sends them (and
    into which st.vega_lite_chart would convert rows on every call): a redraw then only
    copies them into its message."""
    datasets = {
        name: dataframe_util.convert_anything_to_arrow_bytes(pd.DataFrame(rows))
        for name, rows in spec.get("datasets", {}).items()
    }
    return {**spec, "datasets": datasets} if datasets else spec


@st.cache_resource(ttl=FRESH_SECONDS, max_entries=256, show_spinner=False)
def runs_listing(filters: RunFilters, version: Version) -> RunsListing:
    """The Runs page's rows for `filters`, with each run's status, progress, training reward
    line and best evaluation reward, read after `version` was (the key: the rows are then
    at least as new as the version the page is drawn with, so a change after it is seen)."""
    store = get_store()
    shown, total = store.search_runs(
        text=filters.text,
        statuses=filters.statuses,
        methods=filters.methods,
        tag=filters.tag,
        order=filters.order,
        limit=filters.limit,
        offset=filters.offset,
    )
    ids = [r.id for r in shown]
    lines = store.sparklines(ids, mk.reward_key(mk.TRAIN), points=30)
    best = store.best_metrics(ids, mk.reward_key(mk.EVAL))
    now = store.database_now()  # the clock the heartbeats were written in
    rows = pd.DataFrame(
        [
            {
                "id": r.id,
                "name": r.name,
                "status": status_text(r, phase_of(store, r), HEARTBEAT_TIMEOUT, now),
                "method": r.method,
                "mode": mode(r),
                "model": model_name(r),
                "task": task_name(r),
                "progress": progress(r),
                "step": f"{r.step} / {r.total_steps or '?'}",
                "best eval reward": best.get(r.id),
                "train reward": lines[r.id],
                "created": r.created_at,
                "tags": ", ".join(r.tags) or MISSING,
                "sweep": None if r.sweep_id is None else f"/sweep?sweep={r.sweep_id}",
                "open": f"/run?run={r.id}",
            }
            for r in shown
        ]
    )
    return RunsListing(tuple(shown), total, pa.Table.from_pandas(rows, preserve_index=False))


@dataclass(frozen=True)
class SweepState:
    """A sweep as its live page shows it: the record, its table (jobs.sweeps.driver) and the
    Vega-Lite spec of its options against the objective (None before any objective)."""

    sweep: SweepRecord
    table: pd.DataFrame
    chart: dict | None


@st.cache_resource(ttl=FRESH_SECONDS, max_entries=256, show_spinner=False)
def sweep_version(sweep_id: int) -> Version:
    """The version of a sweep's live page: its status and its runs."""
    store = get_store()
    status = store.get_sweep(sweep_id).status.value
    signs = store.run_signs(sweep_ids=[sweep_id])
    return version_of(signs.runs, signs.now, status)


@st.cache_resource(ttl=FRESH_SECONDS, max_entries=16, show_spinner=False)
def sweeps_version(limit: int) -> Version:
    """The version of the Sweeps page of the newest `limit` sweeps: their statuses and the
    runs of those still active."""
    store = get_store()
    sweeps = store.list_sweeps(limit=limit)
    active = [s.id for s in sweeps if s.status is SweepStatus.ACTIVE]
    signs = store.run_signs(sweep_ids=active)
    return version_of(signs.runs, signs.now, ",".join(f"{s.id}:{s.status.value}" for s in sweeps))


@st.cache_resource(ttl=SWEEP_FRESH_SECONDS, max_entries=256, show_spinner=False)
def sweep_state(sweep_id: int, version: Version) -> SweepState:
    """Sweep `sweep_id` as its page shows it, read after `version` was (see runs_listing)."""
    store = get_store()
    sweep = store.get_sweep(sweep_id)
    table = sweep_table(store, sweep_id)
    chart = sweep_view.options_chart(table, SweepSpec.from_dict(sweep.spec))
    return SweepState(sweep, table, None if chart is None else sendable(chart.to_dict()))


@st.cache_resource(ttl=SWEEP_FRESH_SECONDS, max_entries=16, show_spinner=False)
def sweeps_listing(limit: int, version: Version) -> tuple[tuple[SweepRecord, ...], pa.Table]:
    """The newest `limit` sweeps and the Sweeps page's table of them, read after `version`
    was (see runs_listing)."""
    store = get_store()
    sweeps = tuple(store.list_sweeps(limit=limit))
    rows = pd.DataFrame([sweep_view.listing_row(s, sweep_table(store, s.id)) for s in sweeps])
    return sweeps, pa.Table.from_pandas(rows, preserve_index=False)


def forget(run_ids: list[int]) -> None:
    """Drops what is kept of these runs and of the Runs page, after an action changed them."""
    for run_id in run_ids:
        run_state.clear(run_id)
        run_version.clear(run_id)
    runs_version.clear()
    runs_listing.clear()


def forget_sweep(sweep_id: int) -> None:
    """Drops what is kept of this sweep and of the Sweeps page, after an action changed it."""
    sweep_version.clear(sweep_id)
    sweep_state.clear()
    sweeps_version.clear()
    sweeps_listing.clear()
