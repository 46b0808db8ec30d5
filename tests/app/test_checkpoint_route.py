"""A checkpoint downloads from the dashboard without the dashboard holding it: the route
(app/checkpoint_route.py) answers 401 to a request without a valid download ticket for that
run and step before it reads the store or a file, 404 to a step that is not a recorded
checkpoint, and otherwise streams the tar of `eslab export --checkpoint`, byte for byte the
checkpoint's files; the Run page links to it with a fresh ticket of the tab's login (a
viewer's too). On the dashboard as `eslab serve` runs it, a 300 MiB file streams while the
server's memory stays flat."""

from __future__ import annotations

import io
import os
import tarfile
import time
import urllib.request
from pathlib import Path

import pandas as pd
import pytest
from starlette.applications import Starlette
from starlette.testclient import TestClient
from streamlit.testing.v1 import AppTest

from app import auth, checkpoint_route, tickets
from jobs.store.store import Store
from tests.app.conftest import seed, write_task
from tests.app.test_pages import MAIN, TIMEOUT, text_of
from tests.app.test_upload_route import MIB, REPLY_TIMEOUT_S, rss_kib, same_data, served, ticket_of
from tests.app.test_viewer_limits import checkpoint

__all__ = ["same_data", "served"]  # fixtures of the served dashboard, shared


def ticket(name: str, run_id: int = 1, step: int = 2) -> str:
    return ticket_of(name, tickets.DOWNLOAD, checkpoint_route.subject(run_id, step))


def url(run_id: int = 1, step: int = 2) -> str:
    return f"{checkpoint_route.CHECKPOINTS_ROUTE}/{run_id}/{step}"


@pytest.fixture
def client(store, data_folder, editor_and_viewer, tmp_path) -> TestClient:
    """The route over the seeded store, with run 1's checkpoint of step 2 on disk (a file of
    random bytes, a nested file and a link to /etc/passwd), logins `ed` and `vi`."""
    folder = checkpoint(store, tmp_path)
    (folder / "sub").mkdir()
    (folder / "sub" / "config.json").write_text('{"a": 1}')
    return TestClient(Starlette(routes=checkpoint_route.ROUTES))


def test_no_valid_ticket_is_refused_before_the_store_is_read(client, monkeypatch):
    def no_reads(*_args):
        raise AssertionError("the route looked for the checkpoint before the ticket")

    monkeypatch.setattr(checkpoint_route, "_recorded", no_reads)
    expired = tickets.mint(
        auth.signed_in(auth.load_users(auth.auth_path())["vi"]),
        tickets.DOWNLOAD,
        checkpoint_route.subject(1, 2),
        now=time.time() - tickets.TICKET_TTL_S - 1,
    )
    body, _, signature = ticket("vi").partition(".")
    refused = {
        "none": client.get(url()),
        "forged": client.get(url(), params={"ticket": body + "." + "0" * len(signature)}),
        "expired": client.get(url(), params={"ticket": expired}),
        "an upload's": client.get(url(), params={"ticket": ticket_of("ed")}),
        "of step 3": client.get(url(1, 3), params={"ticket": ticket("vi")}),
        "of run 2": client.get(url(2, 2), params={"ticket": ticket("vi")}),
    }
    for what, reply in refused.items():
        assert reply.status_code == 401, (what, reply.text)
    assert "expired" in refused["expired"].text
    assert "not for this checkpoint download" in refused["of run 2"].text


def test_a_step_that_is_no_recorded_checkpoint_is_404(client, store):
    reply = client.get(url(1, 3), params={"ticket": ticket("vi", 1, 3)})
    assert reply.status_code == 404
    assert reply.text == "run 1 has no checkpoint of step 3 (its checkpoints: 2)"
    assert client.get(url(9, 2), params={"ticket": ticket("vi", 9, 2)}).status_code == 404


def test_a_viewer_downloads_the_checkpoint_byte_for_byte(client, tmp_path):
    reply = client.get(url(), headers={"Authorization": f"Bearer {ticket('vi')}"})
    assert reply.status_code == 200, reply.text
    disposition = 'attachment; filename="run-1-alpha-run-step-2.tar"'
    assert reply.headers["content-disposition"] == disposition
    folder = tmp_path / "ckpt" / "step-2"
    with tarfile.open(fileobj=io.BytesIO(reply.content)) as tar:
        files = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}
        link = tar.getmember("step-2/link")
    on_disk = {
        f"step-2/{p.relative_to(folder)}": p.read_bytes()
        for p in folder.rglob("*")
        if p.is_file() and not p.is_symlink()
    }
    assert files == on_disk and set(files) == {"step-2/weights.bin", "step-2/sub/config.json"}
    assert link.issym() and link.linkname == "/etc/passwd"


def test_the_run_page_links_each_checkpoint_with_a_ticket_for_it(client, tmp_path):
    """A viewer's Run page: the checkpoint's link opens it; the server's command is still
    there; a recorded checkpoint that is gone has no link."""
    missing = tmp_path / "gone" / "step-1"
    Store(os.environ["ESLAB_DATABASE_URL"]).add_checkpoint(1, 1, str(missing))
    at = AppTest.from_file(MAIN, default_timeout=TIMEOUT)
    at.session_state[auth.SESSION_KEY] = auth.signed_in(auth.load_users(auth.auth_path())["vi"])
    at.run()
    at = at.switch_page("app_pages/run.py")
    at.query_params["run"] = "1"
    at.run()
    assert not at.exception, at.exception
    [table] = [d.value for d in at.dataframe if "download" in d.value]
    links = dict(zip(table["step"], table["download"], strict=True))
    assert pd.isna(links[1]) and links[2].startswith(f"{url()}?ticket=")
    reply = client.get(links[2])
    assert reply.status_code == 200 and len(reply.content) > 2**19
    assert "eslab export 1 --checkpoint 2 --out run-1-alpha-run-step-2.tar" in text_of(at)


def test_memory_stays_flat_while_a_large_checkpoint_streams(same_data, tmp_path):
    """The served dashboard (uvicorn under Streamlit, another process) streams a 300 MiB
    file; its resident memory, sampled while the download runs, grows by far less."""
    size = 300 * MIB
    seed(same_data.folder, write_task(tmp_path))  # the served dashboard's database
    folder = tmp_path / "big" / "step-2"
    folder.mkdir(parents=True)
    with (folder / "weights.bin").open("wb") as f:
        f.truncate(size)  # sparse: costs no disk, reads as zeros
    Store(same_data.env["ESLAB_DATABASE_URL"]).add_checkpoint(1, 2, str(folder))
    before = rss_kib(same_data.pid)
    peak, received = before, 0
    link = f"http://{same_data.base}{url()}?ticket={ticket('vi')}"
    with urllib.request.urlopen(link, timeout=REPLY_TIMEOUT_S) as reply:
        while chunk := reply.read(MIB):
            received += len(chunk)
            peak = max(peak, rss_kib(same_data.pid))
    assert received > size
    assert (peak - before) * 1024 < size / 5, f"grew {(peak - before) // 1024} MiB"


def test_the_cli_and_the_route_write_the_same_tar(client, tmp_path):
    from app.cli import main

    out = tmp_path / "cli.tar"
    assert main(["export", "1", "--checkpoint", "2", "--out", str(out)]) == 0
    reply = client.get(url(), params={"ticket": ticket("ed")})
    assert Path(out).read_bytes() == reply.content
