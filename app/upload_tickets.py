"""Tickets for the dataset upload route (app/upload_route.py). The New run page mints one for
the editor who is logged in; the route verifies it from the request's headers before it
reads a byte of the body, so nobody without one can make the dashboard take in a file.

A ticket is `PAYLOAD.SIGNATURE`: the payload names the user, a fingerprint of the password
hash they logged in with (the login's own, app.auth.Session) and when the ticket expires; the
signature is an HMAC-SHA256 under a key in the data folder's private folder
(jobs.private_files), so only processes of the user who runs the dashboard can mint one. As
with every action, the role is the auth file's when the ticket is used: a viewer's ticket, a
removed user's or one minted before a password change is refused."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import secrets
import time
from dataclasses import dataclass

from app import auth
from jobs.private_files import read_private, write_private
from jobs.ray_jobs import SubmitError

KEY_FILE = "upload-ticket-key"
TICKET_TTL_S = 15 * 60
"""Long enough to pick a file and start its upload; checked when the upload starts."""
MAX_TICKET_CHARS = 2048
UNAUTHORIZED, FORBIDDEN = 401, 403


class TicketError(Exception):
    """The ticket does not let this upload in; `status` is the HTTP answer (401: no valid
    ticket, 403: a valid ticket of someone who may not upload)."""

    def __init__(self, message: str, status: int = UNAUTHORIZED) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Holder:
    """Whom a ticket is for: a login (its name and password fingerprint) and its expiry."""

    session: auth.Session
    expires: float


def mint(session: auth.Session, now: float | None = None) -> str:
    """A ticket for `session` (the tab's login; auth.LOCAL_USER's when logins are off) that
    lasts TICKET_TTL_S."""
    expires = (time.time() if now is None else now) + TICKET_TTL_S
    payload = json.dumps({"u": session.name, "s": session.stamp, "e": expires}).encode()
    body = base64.urlsafe_b64encode(payload).decode().rstrip("=")
    return f"{body}.{_sign(body)}"


def local_session() -> auth.Session:
    """The login everyone has when ESLAB_AUTH_FILE is unset (loopback only)."""
    return auth.Session(auth.LOCAL_USER.name, "")


def verify(ticket: str, now: float | None = None) -> auth.User:
    """The editor `ticket` lets upload, as the auth file has them now; TicketError saying
    why not (a forged, malformed or expired ticket, a user removed, demoted or with a new
    password)."""
    holder = _read(ticket)
    if holder.expires < (time.time() if now is None else now):
        raise TicketError("the upload ticket has expired: open a new one on the New run page")
    user = _user_now(holder.session)
    if not user.is_editor:
        raise TicketError(f"{user.name} is a {user.role}: only editors may upload", FORBIDDEN)
    return user


def _read(ticket: str) -> Holder:
    body, _, signature = ticket.strip().partition(".")
    if len(ticket) > MAX_TICKET_CHARS or not hmac.compare_digest(
        signature.encode(), _sign(body).encode()
    ):
        raise TicketError("not a valid upload ticket: open one on the New run page")
    try:
        data = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
        return Holder(auth.Session(str(data["u"]), str(data["s"])), float(data["e"]))
    except (binascii.Error, ValueError, TypeError, KeyError) as exc:  # signed, so ours: a bug
        raise TicketError(f"an upload ticket that cannot be read ({exc})") from None


def _user_now(session: auth.Session) -> auth.User:
    path = auth.auth_path()
    if path is None:
        if session == local_session():
            return auth.LOCAL_USER
        raise TicketError("the ticket names a login, but this dashboard has no logins")
    try:
        user = auth.session_user(path, session)
    except auth.AuthError as exc:
        raise TicketError(f"logins cannot be checked: {exc}", FORBIDDEN) from None
    if user is None:
        raise TicketError(
            f"{session.name} was removed or changed password since the ticket was made"
        )
    return user


def _sign(body: str) -> str:
    return hmac.new(_key(), body.encode(), hashlib.sha256).hexdigest()


def _key() -> bytes:
    """The signing key, made on first use; only this user can read it (jobs.private_files
    refuses a folder or file others could have prepared or can read)."""
    try:
        text = read_private(KEY_FILE)
        if not text:
            write_private(KEY_FILE, secrets.token_hex(32))
            text = read_private(KEY_FILE)
    except (OSError, SubmitError) as exc:
        raise TicketError(f"no key to sign upload tickets with: {exc}", FORBIDDEN) from None
    if not text:
        raise TicketError("the key of upload tickets cannot be read", FORBIDDEN)
    return text.strip().encode()
