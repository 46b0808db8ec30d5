"""The dashboard's door for checkpoints: a run's checkpoint as a tar, streamed.

    GET /api/checkpoints/RUN/STEP?ticket=TICKET     (or `Authorization: Bearer TICKET`)

Streamlit's download button holds a file whole in the server's memory, once per click, so a
checkpoint comes through this route instead, which app/server.py mounts beside the
dashboard. The ticket (app.tickets, DOWNLOAD) is minted by the Run page's Checkpoints tab
for the login of the tab, for that run and step only; it is checked first, before the store
or a file is read (401 without a valid one). Anyone who may view the run may download its
checkpoints: any login, viewers included, as the Run page shows them (without logins, on
loopback, everyone). The folder is the one the store recorded for that step, never a path
from the request (404 for a step that is not a recorded checkpoint); the tar is
app.exports.checkpoint_tar_chunks, a chunk at a time, so memory stays flat whatever the
checkpoint's size. The ticket rides in the link's query string, so it lands in the browser's
history: it opens that one checkpoint, for that user, for tickets.TICKET_TTL_S."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote

import anyio
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from app.exports import (
    NoCheckpoint,
    checkpoint_file_name,
    checkpoint_folder,
    checkpoint_tar_chunks,
)
from app.state import get_store
from app.tickets import DOWNLOAD, TicketError, verify
from app.upload_route import bearer_ticket, refusal
from jobs.store.errors import StoreError

CHECKPOINTS_ROUTE = "/api/checkpoints"
NOT_FOUND = 404


def subject(run_id: int, step: int) -> str:
    """What a download ticket is bound to: one checkpoint of one run."""
    return f"run {run_id} step {step}"


def download_link(origin: str, run_id: int, step: int, ticket: str) -> str:
    """The address that downloads checkpoint `step` of run `run_id` with `ticket`, on the
    dashboard at `origin` (scheme://host:port)."""
    return f"{origin}{CHECKPOINTS_ROUTE}/{run_id}/{step}?ticket={quote(ticket, safe='')}"


async def get_checkpoint(request: Request) -> Response:
    """The tar of the checkpoint the request names, for the holder of a ticket for it."""
    run_id, step = request.path_params["run"], request.path_params["step"]
    try:
        ticket = request.query_params.get("ticket") or bearer_ticket(request, DOWNLOAD)
        verify(ticket, DOWNLOAD, subject(run_id, step))
    except TicketError as exc:
        return refusal(str(exc), exc.status)
    try:
        name, folder = await anyio.to_thread.run_sync(_recorded, run_id, step)
    except (NoCheckpoint, StoreError) as exc:
        return refusal(str(exc), NOT_FOUND)
    return StreamingResponse(
        checkpoint_tar_chunks(folder),  # a plain iterator: Starlette reads it off the loop
        media_type="application/x-tar",
        headers={
            "Content-Disposition": f'attachment; filename="{name}"',
            "Cache-Control": "no-store",
            "X-Content-Type-Options": "nosniff",
        },
    )


def _recorded(run_id: int, step: int) -> tuple[str, Path]:
    """(the download's file name, the checkpoint's folder) from the store."""
    store = get_store()
    run = store.get_run(run_id)
    return checkpoint_file_name(run, step), checkpoint_folder(store, run, step)


ROUTES = [Route(CHECKPOINTS_ROUTE + "/{run:int}/{step:int}", get_checkpoint, methods=["GET"])]
