"""The dashboard's door for datasets of any size, and the lock on Streamlit's own uploads.

Streamlit keeps every file a browser sends it in memory, and its upload endpoint
(`PUT /_stcore/upload_file/SESSION/ID`) accepts a file from any tab that opened a session,
logged in or not; `eslab serve` therefore caps it at FORM_UPLOAD_MB (run configurations,
sweep spaces, small datasets), and LoginBeforeUpload refuses it, before the body is read, to
a tab that has not logged in. Larger datasets come through DATASETS_ROUTE instead:

    PUT /api/datasets/NAME.parquet      Authorization: Bearer TICKET      body: the file

The ticket (app.tickets, minted by the New run page for an editor) is checked from
the headers, then the declared size; only then is the body read, chunk by chunk, into the
uploads folder (engine.data.uploads.UploadWriter: capped, validated, renamed into place,
nothing left on failure). UPLOAD_PAGE is a page with a file picker that sends the file so,
the ticket in its URL's fragment (never sent to a server or a log). app/server.py mounts
all of it beside the dashboard, on the same address."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import anyio
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from app import auth
from app.tickets import FORBIDDEN, UPLOAD, Purpose, TicketError, verify
from engine.data.datasets import DatasetError
from engine.data.uploads import MIB, UploadWriter, max_upload_mb, too_large
from engine.paths import config_path

DATASETS_ROUTE = "/api/datasets"
UPLOAD_PAGE = "/api/upload"
PAGE_FILES = Path(__file__).resolve().parent / "upload_page"
# What a page of ours may do: its own script, requests to this origin, nothing else.
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; connect-src 'self'; "
    "style-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-store",
}
STREAMLIT_UPLOAD = re.compile(r"/_stcore/upload_file/([^/]+)/")
TOO_LARGE, BAD_REQUEST = 413, 400


async def put_dataset(request: Request) -> Response:
    """Keep the body as a dataset, for the editor whose ticket the request carries."""
    name = request.path_params["name"]
    try:
        verify(bearer_ticket(request, UPLOAD), UPLOAD)
        _check_declared_size(request, name)
    except TicketError as exc:
        return refusal(str(exc), exc.status)
    except DatasetError as exc:
        return refusal(str(exc), TOO_LARGE)
    try:
        with UploadWriter(name) as upload:
            async for chunk in request.stream():
                upload.write(chunk)
            kept = await anyio.to_thread.run_sync(upload.keep)  # reads it: not on the loop
    except DatasetError as exc:
        status = TOO_LARGE if "ESLAB_MAX_UPLOAD_MB" in str(exc) else BAD_REQUEST
        return refusal(str(exc), status)
    return JSONResponse({"train_file": config_path(kept.path), "rows": kept.rows})


def bearer_ticket(request: Request, purpose: Purpose) -> str:
    """The ticket of the request's `Authorization: Bearer` header; TicketError (401)
    without one."""
    scheme, _, ticket = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not ticket.strip():
        raise TicketError(
            f"a {purpose.name} needs `Authorization: Bearer TICKET` (from {purpose.where})"
        )
    return ticket.strip()


def _check_declared_size(request: Request, name: str) -> None:
    """Refuse a body whose Content-Length is over the cap before any of it arrives (one
    without it, chunked, is cut off by UploadWriter when it passes the cap)."""
    declared = request.headers.get("content-length", "")
    limit = max_upload_mb()
    if declared.isascii() and declared.isdigit() and int(declared) > limit * MIB:
        raise DatasetError(too_large(name, int(declared), limit))


def refusal(message: str, status: int) -> Response:
    """The answer to a refused request; the connection closes, so an unread body is dropped
    by the server instead of being read to reach the next request."""
    return PlainTextResponse(message, status_code=status, headers={"Connection": "close"})


async def upload_page(request: Request) -> Response:
    return FileResponse(PAGE_FILES / "upload.html", headers=PAGE_HEADERS)


async def upload_script(request: Request) -> Response:
    return FileResponse(
        PAGE_FILES / "upload.js", media_type="text/javascript", headers=PAGE_HEADERS
    )


ROUTES = [
    Route(DATASETS_ROUTE + "/{name}", put_dataset, methods=["PUT"]),
    Route(UPLOAD_PAGE, upload_page, methods=["GET"]),
    Route(UPLOAD_PAGE + ".js", upload_script, methods=["GET"]),
]


def upload_links(origin: str, ticket: str) -> tuple[str, str]:
    """(the upload page's address for the browser, a curl command for a shell) on the
    dashboard at `origin` (scheme://host:port), both carrying `ticket`."""
    page = f"{origin}{UPLOAD_PAGE}#ticket={ticket}"
    curl = (
        f"curl --fail-with-body -T FILE.parquet -H {shlex.quote('Authorization: Bearer ' + ticket)}"
        f" {origin}{DATASETS_ROUTE}/"
    )
    return page, curl


# -- Streamlit's own uploads ---------------------------------------------------------------


class LoginBeforeUpload:
    """ASGI middleware: a PUT to Streamlit's upload endpoint from a session that has not
    logged in is answered 403 before its body is read. The login is what the tab's session
    state holds (app.auth.SESSION_KEY), checked against the auth file now; without logins
    (loopback only) every session passes. A Streamlit that no longer lets us find the
    session refuses every upload: closed, not open."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        match = STREAMLIT_UPLOAD.search(scope.get("path", "")) if scope["type"] == "http" else None
        if match and scope.get("method") == "PUT" and not logged_in(match.group(1)):
            await refusal("log in to upload files", FORBIDDEN)(scope, receive, send)
            return
        await self.app(scope, receive, send)


def logged_in(session_id: str) -> bool:
    """Whether the Streamlit session `session_id` belongs to a tab that logged in (any role:
    viewers may import a run configuration)."""
    path = auth.auth_path()
    if path is None:
        return True
    try:
        from streamlit.runtime import Runtime

        state = Runtime.instance().get_app_session(session_id).session_state
        login = state[auth.SESSION_KEY]
        return auth.session_user(path, login) is not None
    except Exception:  # no session, no login, or a Streamlit that changed: refuse
        return False
