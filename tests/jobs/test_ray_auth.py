"""Ray's token: made when none exists (readable by this user only), refused when others can
read it or the operator's environment switches token mode off, and a RAY_ADDRESS cluster that
takes jobs without a token is refused. The real head in token mode, from an empty HOME, is
tests/jobs/test_service.py's; a run's own cluster (ray.init()) is the last test's."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from app.cli import main
from engine.backends import ray_auth
from engine.backends.ray_auth import (
    RayAuthError,
    ensure_token,
    refuse_open_cluster,
    require_token_mode,
)
from engine.hosts import is_loopback
from engine.paths import PROJECT_ROOT


@pytest.fixture
def empty_home(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    for name in (ray_auth.TOKEN_SETTING, ray_auth.TOKEN_PATH_SETTING, ray_auth.MODE_SETTING):
        monkeypatch.delenv(name, raising=False)
    return home


def test_a_token_is_made_for_this_user_only_and_kept(empty_home):
    path = ensure_token()
    assert path == empty_home / ".ray" / "auth_token"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    token = path.read_text()
    assert len(token) >= 32
    assert ensure_token() == path and path.read_text() == token  # not made again


def test_a_token_of_mine_others_can_read_is_made_private(empty_home, capsys):
    """As Ray's own ray.init() leaves it, with the usual umask."""
    path = empty_home / ".ray" / "auth_token"
    path.parent.mkdir()
    path.write_text("secret")
    path.chmod(0o644)
    assert ensure_token() == path
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_text() == "secret"
    assert f"{path} was readable by other users of this machine: made it 0600" in (
        capsys.readouterr().err
    )


def test_a_readable_token_of_another_user_is_refused(empty_home, monkeypatch):
    path = empty_home / ".ray" / "auth_token"
    path.parent.mkdir()
    path.write_text("secret")
    path.chmod(0o644)
    monkeypatch.setattr(os, "getuid", lambda: os.stat(path).st_uid + 1)
    with pytest.raises(RayAuthError, match="belongs to another user and others can read it"):
        ensure_token()
    assert stat.S_IMODE(path.stat().st_mode) == 0o644


def test_a_named_token_file_must_exist(empty_home, monkeypatch):
    monkeypatch.setenv(ray_auth.TOKEN_PATH_SETTING, str(empty_home / "missing"))
    with pytest.raises(RayAuthError, match=r"RAY_AUTH_TOKEN_PATH names .*missing, which does not"):
        ensure_token()
    assert not (empty_home / "missing").exists()


def test_a_token_in_the_environment_needs_no_file(empty_home, monkeypatch):
    monkeypatch.setenv(ray_auth.TOKEN_SETTING, "from-the-environment")
    assert ensure_token() is None
    assert not (empty_home / ".ray").exists()


def test_token_mode_is_switched_on_for_the_processes_to_come(empty_home):
    require_token_mode()
    assert os.environ[ray_auth.MODE_SETTING] == "token"
    assert (empty_home / ".ray" / "auth_token").is_file()


def test_an_environment_that_switches_token_mode_off_is_refused(empty_home, monkeypatch):
    monkeypatch.setenv(ray_auth.MODE_SETTING, "disabled")
    with pytest.raises(RayAuthError, match=r"RAY_AUTH_MODE=disabled .*--insecure-ray-no-token"):
        require_token_mode()


def test_serve_refuses_ray_without_tokens_in_one_line(empty_home, monkeypatch, db, capsys):
    monkeypatch.setenv(ray_auth.MODE_SETTING, "disabled")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert main(["serve", "--port", "1"]) == 2
    err = capsys.readouterr().err
    assert "RAY_AUTH_MODE=disabled would run Ray without token authentication" in err
    assert "Ray dashboard on" not in capsys.readouterr().out


class _JobsAPI(BaseHTTPRequestHandler):
    status = 200

    def do_GET(self) -> None:
        self.send_response(self.status)
        self.end_headers()
        self.wfile.write(b"[]")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def jobs_api() -> Iterator[tuple[str, type[_JobsAPI]]]:
    """A stand-in for a cluster's job API on loopback, answering every GET with `status`."""
    handler = type("Handler", (_JobsAPI,), {})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", handler
    server.shutdown()
    server.server_close()


def test_a_cluster_that_lists_jobs_without_a_token_is_refused(jobs_api):
    url, _handler = jobs_api
    with pytest.raises(RayAuthError, match=f"the Ray cluster at {url} takes jobs .*RAY_AUTH_MODE"):
        refuse_open_cluster(url)


def test_a_cluster_that_asks_for_the_token_is_used(jobs_api):
    url, handler = jobs_api
    handler.status = 401
    refuse_open_cluster(url)


def test_a_cluster_not_reachable_over_http_is_left_to_the_first_request():
    refuse_open_cluster("ray://127.0.0.1:1")
    refuse_open_cluster("http://127.0.0.1:1")


LOCAL_CLUSTER = """
import json, psutil, ray
from engine.backends.ray_auth import LOOPBACK_ONLY_SETTING, local_cluster
import os, ray._private.ray_constants as constants  # Ray imported first, as in a run's process
before = os.environ.get(LOOPBACK_ONLY_SETTING), constants.ENABLE_RAY_CLUSTER
with local_cluster():
    ray.init(log_to_driver=False, include_dashboard=False, num_cpus=1)
assert (os.environ.get(LOOPBACK_ONLY_SETTING), constants.ENABLE_RAY_CLUSTER) == before
me = psutil.Process()
listening = [
    c.laddr.ip
    for p in [me, *me.children(recursive=True)]
    for c in p.net_connections(kind="inet")
    if c.status == psutil.CONN_LISTEN
]
print(json.dumps({"listening": listening, "answer": ray.get(ray.remote(lambda: 42).remote())}))
ray.shutdown()
"""


@pytest.mark.heavy
def test_a_runs_own_ray_cluster_is_on_loopback_with_a_token(empty_home):
    """The cluster a foreground run of several engines starts with ray.init() (EnginePool)."""
    result = subprocess.run(
        [sys.executable, "-c", LOCAL_CLUSTER],
        env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["answer"] == 42
    assert len(report["listening"]) >= 5, report  # GCS, raylet, agents were found
    assert all(is_loopback(ip) for ip in report["listening"]), report
    assert stat.S_IMODE((empty_home / ".ray" / "auth_token").stat().st_mode) == 0o600
