"""Tickets for the dashboard's routes beside Streamlit: the dataset upload
(app/upload_route.py), the checkpoint download (app/checkpoint_route.py) and the version of a
live page (app/live_route.py). A page mints one
for the user who is logged in; the route verifies it from the request before it reads a
body or touches a file, so nobody without one can make the dashboard take in or send out a
file.

A ticket is `PAYLOAD.SIGNATURE`: the payload names the user, a fingerprint of the password
hash they logged in with (the login's own, app.auth.Session), what the ticket is for (its
Purpose and subject: an upload ticket opens no download, a download ticket of run 1 step 2
opens no other checkpoint) and when it expires; the signature is an HMAC-SHA256 under a key
in the data folder's private folder (jobs.private_files), so only processes of the user who
runs the dashboard can mint one. As with every action, the role is the auth file's when the
ticket is used: a removed user's ticket, one minted before a password change, or a viewer's
for an editors-only purpose is refused."""

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

KEY_FILE = "ticket-key"
TICKET_TTL_S = 15 * 60
"""Long enough to pick a file and start its upload, or to click a download link; checked
when the request starts. A live page whose ticket expired redraws itself for a new one."""
MAX_TICKET_CHARS = 2048
UNAUTHORIZED, FORBIDDEN = 401, 403


@dataclass(frozen=True)
class Purpose:
    """What a ticket opens: `name` is signed into it, `editors_only` says whether a viewer's
    ticket is refused, `where` is the page that mints a new one (for the refusals)."""

    name: str
    editors_only: bool
    where: str


UPLOAD = Purpose("dataset upload", editors_only=True, where="the New run page")
DOWNLOAD = Purpose("checkpoint download", editors_only=False, where="the run's Checkpoints tab")
LIVE = Purpose("live page's version", editors_only=False, where="the page again")


class TicketError(Exception):
    """The ticket does not open this request; `status` is the HTTP answer (401: no valid
    ticket for it, 403: a valid ticket of someone who may not do it)."""

    def __init__(self, message: str, status: int = UNAUTHORIZED) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Claims:
    """What a ticket says: whose login, for what (purpose name and subject), until when."""

    session: auth.Session
    purpose: str
    subject: str
    expires: float


def mint(
    session: auth.Session, purpose: Purpose, subject: str = "", now: float | None = None
) -> str:
    """A ticket for `session` (the tab's login; local_session() when logins are off) that
    opens `purpose` for `subject` (what the route names, e.g. one checkpoint) during
    TICKET_TTL_S."""
    expires = (time.time() if now is None else now) + TICKET_TTL_S
    claims = {"u": session.name, "s": session.stamp, "p": purpose.name, "o": subject}
    payload = json.dumps({**claims, "e": expires}).encode()
    body = base64.urlsafe_b64encode(payload).decode().rstrip("=")
    return f"{body}.{_sign(body)}"


def local_session() -> auth.Session:
    """The login everyone has when ESLAB_AUTH_FILE is unset (loopback only)."""
    return auth.Session(auth.LOCAL_USER.name, "")


def verify(ticket: str, purpose: Purpose, subject: str = "", now: float | None = None) -> auth.User:
    """The user `ticket` lets do `purpose` on `subject`, as the auth file has them now;
    TicketError saying why not (forged, malformed, for another purpose or subject, expired,
    a user removed, with a new password, or a viewer where only editors may)."""
    claims = _read(ticket, purpose)
    if claims.purpose != purpose.name or claims.subject != subject:
        raise TicketError(f"this ticket is not for this {purpose.name}: open {purpose.where}")
    if claims.expires < (time.time() if now is None else now):
        raise TicketError(f"the {purpose.name} ticket has expired: open {purpose.where} again")
    user = _user_now(claims.session)
    if purpose.editors_only and not user.is_editor:
        raise TicketError(
            f"{user.name} is a {user.role}: only editors may make a {purpose.name}", FORBIDDEN
        )
    return user


def _read(ticket: str, purpose: Purpose) -> Claims:
    body, _, signature = ticket.strip().partition(".")
    if len(ticket) > MAX_TICKET_CHARS or not hmac.compare_digest(
        signature.encode(), _sign(body).encode()
    ):
        raise TicketError(f"not a valid {purpose.name} ticket: open {purpose.where}")
    try:
        data = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
        session = auth.Session(str(data["u"]), str(data["s"]))
        return Claims(session, str(data["p"]), str(data["o"]), float(data["e"]))
    except (binascii.Error, ValueError, TypeError, KeyError) as exc:  # signed, so ours: a bug
        raise TicketError(f"a ticket that cannot be read ({exc})") from None


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
        raise TicketError(f"no key to sign tickets with: {exc}", FORBIDDEN) from None
    if not text:
        raise TicketError("the key of the tickets cannot be read", FORBIDDEN)
    return text.strip().encode()
