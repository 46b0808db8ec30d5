"""The dashboard's door for live pages: the version of what a page shows, as JSON.

    GET /api/live/run/RUN[?since=STATE]  Authorization: Bearer TICKET   -> {"state": ...}
    GET /api/live/runs                   (the Runs page)
    GET /api/live/sweep/SWEEP            (a Sweep page)
    GET /api/live/sweeps                 (the Sweeps page, of its newest SWEEPS_SHOWN sweeps)

With `since` (the version the page has), the answer waits until the version differs from it
or version_wait.HOLD_SECONDS passed (a long poll, app/version_wait.py); without, it comes at
once. A live page asks again as soon as it has an answer (app/version_watch.py) and reruns a
fragment only when the answer differs from the version it was drawn with (app/live.py), so
between two steps twenty viewers cost the dashboard a request each per HOLD_SECONDS, not
twenty script runs, nor twenty requests a second. Each answer comes from a read that every
viewer shares (app.live.run_version and its kin), done off the event loop. What a page shows
may be secret, so the ticket (app.tickets, LIVE) comes first: minted by the page for its
tab's login and bound to what that page shows (one run, one sweep, or a list); with logins
off, the local login's, as for every route. An expired ticket gets 401, which makes the page
redraw itself and so mint a new one."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from app import live, version_wait
from app.tickets import LIVE, TicketError, verify
from app.upload_route import bearer_ticket, refusal

LIVE_ROUTE = "/api/live"
RUNS_PATH = f"{LIVE_ROUTE}/runs"
RUNS_SUBJECT = "runs"
SWEEPS_PATH = f"{LIVE_ROUTE}/sweeps"
SWEEPS_SUBJECT = "sweeps"
SWEEPS_SHOWN = 100
"""How many sweeps, the newest, the Sweeps page shows."""


def run_subject(run_id: int) -> str:
    """What a live ticket of a Run page is bound to: that run."""
    return f"run {run_id}"


def run_path(run_id: int) -> str:
    """The address of the version of run `run_id`'s page."""
    return f"{LIVE_ROUTE}/run/{run_id}"


def sweep_subject(sweep_id: int) -> str:
    """What a live ticket of a Sweep page is bound to: that sweep."""
    return f"sweep {sweep_id}"


def sweep_path(sweep_id: int) -> str:
    """The address of the version of sweep `sweep_id`'s page."""
    return f"{LIVE_ROUTE}/sweep/{sweep_id}"


async def get_run_version(request: Request) -> Response:
    """The version of the Run page of the run the path names."""
    run_id = request.path_params["run"]
    return await _answer(request, run_subject(run_id), lambda: live.run_version(run_id))


async def get_runs_version(request: Request) -> Response:
    """The version of the Runs page."""
    return await _answer(request, RUNS_SUBJECT, live.runs_version)


async def get_sweep_version(request: Request) -> Response:
    """The version of the Sweep page of the sweep the path names."""
    sweep_id = request.path_params["sweep"]
    return await _answer(request, sweep_subject(sweep_id), lambda: live.sweep_version(sweep_id))


async def get_sweeps_version(request: Request) -> Response:
    """The version of the Sweeps page."""
    return await _answer(request, SWEEPS_SUBJECT, lambda: live.sweeps_version(SWEEPS_SHOWN))


async def _answer(request: Request, subject: str, read: Callable[[], live.Version]) -> Response:
    try:
        verify(bearer_ticket(request, LIVE), LIVE, subject)
    except TicketError as exc:
        return refusal(str(exc), exc.status)
    since = request.query_params.get("since")
    if since is None:
        version = await anyio.to_thread.run_sync(read)
    else:
        version = await version_wait.version_after(subject, read, since)
    return JSONResponse(asdict(version), headers={"Cache-Control": "no-store"})


ROUTES = [
    Route(LIVE_ROUTE + "/run/{run:int}", get_run_version, methods=["GET"]),
    Route(RUNS_PATH, get_runs_version, methods=["GET"]),
    Route(LIVE_ROUTE + "/sweep/{sweep:int}", get_sweep_version, methods=["GET"]),
    Route(SWEEPS_PATH, get_sweeps_version, methods=["GET"]),
]
