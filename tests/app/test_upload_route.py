"""Nothing before login can fill the dashboard's memory, and datasets of any size still come
in: on the dashboard as `eslab serve` starts it (app/server.py under `streamlit run`),
Streamlit's upload endpoint refuses a tab that never logged in before reading the body, and
takes at most FORM_UPLOAD_MB from anyone; the dataset route refuses a request without a
valid editor's ticket after its headers, and keeps a ticketed parquet in data/uploads. The
tickets themselves (app/tickets.py): forged, expired, a viewer's, a removed user's, one
minted before a password change, one for another purpose are refused."""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import pytest
from streamlit.proto.BackMsg_pb2 import BackMsg
from streamlit.proto.ForwardMsg_pb2 import ForwardMsg
from websockets.sync.client import connect

from app import auth, tickets, upload_route
from app.tickets import UPLOAD, TicketError
from engine.data.uploads import FORM_UPLOAD_MB, uploads_dir
from engine.paths import PROJECT_ROOT
from jobs.service import dashboard_command
from tests.app.browser import free_port
from tests.app.conftest import write_task
from tests.app.serving import START_DEADLINE_S, answers

MIB = 2**20
REPLY_TIMEOUT_S = 30  # a server that waits for the body never answers: the test fails then


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Iterator[SimpleNamespace]:
    """The dashboard as `eslab serve` runs it, with logins (`ed` editor, `vi` viewer) and a
    data folder of its own; no Ray, no scheduler (uploads need neither)."""
    folder = tmp_path_factory.mktemp("served")
    users = folder / "users.yaml"
    auth.add_user(users, "ed", "editor", "editor-pass")
    auth.add_user(users, "vi", "viewer", "viewer-pass")
    env = {
        **os.environ,
        "PYTHONPATH": str(PROJECT_ROOT),
        "ESLAB_DATA_DIR": str(folder / "data"),
        "ESLAB_DATABASE_URL": f"sqlite:///{folder / 'eslab.db'}",
        auth.ENV: str(users),
    }
    port = free_port()
    log = folder / "dashboard.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            dashboard_command("127.0.0.1", port), env=env, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        base = f"127.0.0.1:{port}"
        wait_until_up(process, f"http://{base}/_stcore/health", log)
        yield SimpleNamespace(base=base, port=port, env=env, folder=folder, pid=process.pid)
    finally:
        process.terminate()
        process.wait(30)


def wait_until_up(process: subprocess.Popen, health: str, log: Path) -> None:
    deadline = time.monotonic() + START_DEADLINE_S
    while not answers(health):
        if process.poll() is not None or time.monotonic() > deadline:
            pytest.fail("the dashboard did not start: " + log.read_text())
        time.sleep(0.3)


@pytest.fixture
def same_data(served, monkeypatch) -> SimpleNamespace:
    """This process on the served dashboard's data folder and auth file, so that a ticket
    minted here is signed with the dashboard's key."""
    monkeypatch.setenv("ESLAB_DATA_DIR", served.env["ESLAB_DATA_DIR"])
    monkeypatch.setenv(auth.ENV, served.env[auth.ENV])
    return served


def headers_only(port: int, request_head: str) -> str:
    """Send a request's headers and none of its body; the server's whole answer, which a
    server that reads the body first would never send (it closes the connection after)."""
    reply = b""
    with socket.create_connection(("127.0.0.1", port), timeout=REPLY_TIMEOUT_S) as s:
        s.sendall(request_head.encode() + b"\r\n")
        while chunk := s.recv(4096):
            reply += chunk
    return reply.decode(errors="replace")


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


# -- Streamlit's own upload endpoint --------------------------------------------------------


@contextmanager
def anonymous_session(base: str) -> Iterator[tuple[str, str]]:
    """(session id, XSRF cookie) of a tab that opened the dashboard and never logged in,
    while it stays open: what anyone who can reach the port gets."""
    with urllib.request.urlopen(f"http://{base}/_stcore/health") as reply:
        cookie = reply.headers["set-cookie"].split(";")[0]
    with connect(
        f"ws://{base}/_stcore/stream",
        subprotocols=["streamlit", cookie.split("=", 1)[1]],
        additional_headers={"Cookie": cookie, "Origin": f"http://{base}"},
    ) as ws:
        rerun = BackMsg()
        rerun.rerun_script.query_string = ""
        ws.send(rerun.SerializeToString())
        for _ in range(50):
            message = ForwardMsg()
            message.ParseFromString(ws.recv(timeout=REPLY_TIMEOUT_S))
            if message.WhichOneof("type") == "new_session":
                yield message.new_session.initialize.session_id, cookie
                return
        raise AssertionError("no session")


def streamlit_put(base: str, session: str, cookie: str, length: int) -> str:
    token = cookie.split("=", 1)[1]
    return (
        f"PUT /_stcore/upload_file/{session}/file-1 HTTP/1.1\r\nHost: {base}\r\n"
        f"Cookie: {cookie}\r\nX-Xsrftoken: {token}\r\n"
        f"Content-Type: multipart/form-data; boundary=b\r\nContent-Length: {length}\r\n"
    )


def test_streamlit_takes_no_upload_from_a_tab_that_never_logged_in(served):
    """The issue's probe: 90 MiB PUTs from a session without a login answered 204 and the
    dashboard grew by 300 MiB. Now the answer comes after the headers, the body unread."""
    with anonymous_session(served.base) as (session, cookie):
        before = rss_kib(served.pid)
        for _ in range(3):
            reply = headers_only(served.port, streamlit_put(served.base, session, cookie, 90 * MIB))
            assert reply.startswith("HTTP/1.1 403"), reply
        small = headers_only(served.port, streamlit_put(served.base, session, cookie, 1000))
        assert small.startswith("HTTP/1.1 403") and "log in to upload" in small
        assert rss_kib(served.pid) - before < 50 * 1024  # not 3 x 90 MiB


def test_streamlit_is_capped_at_yaml_size():
    command = dashboard_command("127.0.0.1", 8501)
    assert command[command.index("--server.maxUploadSize") + 1] == str(FORM_UPLOAD_MB) == "1"


def test_a_logged_in_tab_passes_the_gate(monkeypatch, editor_and_viewer):
    """LoginBeforeUpload asks the tab's session state: a login of the file passes (any
    role), none or a stale one does not, and a Streamlit without the session refuses."""
    from streamlit.runtime import Runtime

    def runtime_with(state: dict) -> None:
        app_session = SimpleNamespace(session_state=state)
        fake = SimpleNamespace(get_app_session=lambda sid: app_session if sid == "s1" else None)
        monkeypatch.setattr(Runtime, "instance", classmethod(lambda cls: fake))

    viewer = auth.signed_in(auth.load_users(editor_and_viewer)["vi"])
    runtime_with({auth.SESSION_KEY: viewer})
    assert upload_route.logged_in("s1")
    assert not upload_route.logged_in("other")
    runtime_with({auth.SESSION_KEY: auth.Session("vi", "an old password's")})
    assert not upload_route.logged_in("s1")
    runtime_with({})
    assert not upload_route.logged_in("s1")


# -- the dataset route ----------------------------------------------------------------------


def route_put(base: str, ticket: str | None, length: int, name: str = "d.parquet") -> str:
    authorization = f"Authorization: Bearer {ticket}\r\n" if ticket is not None else ""
    return (
        f"PUT {upload_route.DATASETS_ROUTE}/{name} HTTP/1.1\r\nHost: {base}\r\n"
        f"{authorization}Content-Length: {length}\r\n"
    )


def ticket_of(name: str, purpose: tickets.Purpose = UPLOAD, subject: str = "") -> str:
    return tickets.mint(auth.signed_in(auth.load_users(auth.auth_path())[name]), purpose, subject)


def test_the_route_refuses_a_body_without_a_ticket_before_reading_it(same_data):
    for ticket in (None, "forged.0000", ticket_of("ed") + "0"):
        reply = headers_only(same_data.port, route_put(same_data.base, ticket, 500 * MIB))
        assert reply.startswith("HTTP/1.1 401") and "connection: close" in reply.lower(), reply
    assert not uploads_dir().exists() or not list(uploads_dir().glob(".*"))  # nothing begun


def test_a_viewer_ticket_is_refused_before_the_body(same_data):
    reply = headers_only(same_data.port, route_put(same_data.base, ticket_of("vi"), 500 * MIB))
    assert reply.startswith("HTTP/1.1 403") and "vi is a viewer" in reply


def test_an_editor_over_the_cap_is_refused_from_the_declared_size(same_data):
    reply = headers_only(same_data.port, route_put(same_data.base, ticket_of("ed"), 500 * MIB))
    assert reply.startswith("HTTP/1.1 413") and "ESLAB_MAX_UPLOAD_MB" in reply


def upload(base: str, ticket: str, body: bytes, name: str) -> tuple[int, str]:
    request = urllib.request.Request(
        f"http://{base}{upload_route.DATASETS_ROUTE}/{name}",
        data=body,
        method="PUT",
        headers={"Authorization": f"Bearer {ticket}"},
    )
    try:
        with urllib.request.urlopen(request, timeout=REPLY_TIMEOUT_S) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_a_ticketed_parquet_lands_in_the_uploads_folder(same_data, tmp_path):
    body = write_task(tmp_path).read_bytes()
    status, text = upload(same_data.base, ticket_of("ed"), body, "my%20set.parquet")
    assert status == 200, text
    [kept] = [p for p in uploads_dir().iterdir() if p.name.endswith("-my-set.parquet")]
    assert f'"train_file":"data/uploads/{kept.name}"' in text and '"rows":4' in text
    assert kept.read_bytes() == body
    status, text = upload(same_data.base, ticket_of("ed"), b"not parquet", "bad.parquet")
    assert status == 400 and "bad.parquet: not a readable parquet file" in text
    assert not [p for p in uploads_dir().iterdir() if "bad" in p.name or p.name.startswith(".")]


def test_the_upload_page_runs_only_its_own_script(same_data):
    with urllib.request.urlopen(f"http://{same_data.base}{upload_route.UPLOAD_PAGE}") as reply:
        page, policy = reply.read().decode(), reply.headers["content-security-policy"]
    assert f'src="{upload_route.UPLOAD_PAGE}.js"' in page
    assert "default-src 'none'" in policy and "script-src 'self'" in policy


# -- tickets --------------------------------------------------------------------------------


@pytest.fixture
def logins(editor_and_viewer, data_folder) -> Path:
    return editor_and_viewer


def test_a_ticket_names_an_editor_as_the_file_has_them_now(logins):
    ticket = ticket_of("ed")
    assert tickets.verify(ticket, UPLOAD).name == "ed"
    with pytest.raises(TicketError, match="expired") as info:
        tickets.verify(ticket, UPLOAD, now=tickets.time.time() + 16 * 60)
    assert info.value.status == 401
    auth.add_user(logins, "ed", "viewer", "editor-pass")  # demoted
    with pytest.raises(TicketError, match="ed was removed or changed password"):
        tickets.verify(ticket, UPLOAD)  # a new hash: the old login's fingerprint is gone
    with pytest.raises(TicketError, match="ed is a viewer") as info:
        tickets.verify(ticket_of("ed"), UPLOAD)
    assert info.value.status == 403


def test_a_forged_ticket_is_refused(logins):
    body, _, signature = ticket_of("vi").partition(".")
    payload = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    payload["u"] = "ed"
    forged = base64.urlsafe_b64encode(json.dumps(payload).encode()).decode().rstrip("=")
    for ticket in (f"{forged}.{signature}", "", "x" * 5000, "é.é"):
        with pytest.raises(TicketError, match="not a valid dataset upload ticket"):
            tickets.verify(ticket, UPLOAD)


def test_a_ticket_opens_only_its_purpose_and_subject(logins):
    """An upload ticket opens no download and a download ticket no upload; a download
    ticket opens only the checkpoint it names."""
    download = ticket_of("ed", tickets.DOWNLOAD, "run 1 step 2")
    assert tickets.verify(download, tickets.DOWNLOAD, "run 1 step 2").name == "ed"
    for purpose, subject in ((UPLOAD, ""), (tickets.DOWNLOAD, "run 1 step 3")):
        with pytest.raises(TicketError, match="this ticket is not for this") as info:
            tickets.verify(download, purpose, subject)
        assert info.value.status == 401
    with pytest.raises(TicketError, match="not for this checkpoint download"):
        tickets.verify(ticket_of("ed"), tickets.DOWNLOAD, "")


def test_the_signing_key_is_private(logins):
    ticket_of("ed")
    key = logins.parent / "private" / tickets.KEY_FILE
    assert key.stat().st_mode & 0o077 == 0
