"""`eslab serve` on the network: a non-loopback --host without ESLAB_AUTH_FILE is refused
before the database, Ray or Streamlit start (unless --insecure-no-login, which warns);
loopback stays open. And the dashboard that serve starts shows no error details."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from streamlit import config as st_config
from streamlit.testing.v1 import AppTest

from app import auth
from app.cli import main
from engine.hosts import is_loopback
from jobs.service import dashboard_command
from tests.app.browser import free_port

ROOT = Path(__file__).resolve().parents[2]
# Nothing listens on port 1: reaching the database step fails at once, with its own message.
UNREACHABLE_DB = "postgresql+psycopg://nobody@127.0.0.1:1/none"
REFUSED = "reachable from other machines and ESLAB_AUTH_FILE is not set"


@pytest.fixture
def no_auth(monkeypatch):
    monkeypatch.delenv(auth.ENV, raising=False)
    monkeypatch.setenv("ESLAB_DATABASE_URL", UNREACHABLE_DB)


def test_serve_on_all_interfaces_without_logins_exits_at_once(tmp_path):
    env = {**os.environ, "ESLAB_DATABASE_URL": UNREACHABLE_DB, "PYTHONPATH": str(ROOT)}
    env.pop(auth.ENV, None)
    env.pop("RAY_ADDRESS", None)
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "app.cli", "serve", "--host", "0.0.0.0", "--port", "1"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    elapsed = time.monotonic() - started
    assert result.returncode == 2, result.stderr
    assert REFUSED in result.stderr
    assert "eslab users add NAME --role editor" in result.stderr
    assert "ESLAB_AUTH_FILE=users.yaml eslab serve --host 0.0.0.0" in result.stderr
    assert "--insecure-no-login" in result.stderr
    # before the database (unreachable here) and Ray: neither is mentioned
    assert "database" not in result.stderr and "Ray" not in result.stdout + result.stderr
    print(f"refused in {elapsed:.2f} s")


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "", "192.0.2.10", "no-such-host.invalid"])
def test_every_non_loopback_host_is_refused(no_auth, capsys, host):
    assert main(["serve", "--host", host, "--port", "1"]) == 2
    assert REFUSED in capsys.readouterr().err


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "localhost"])
def test_loopback_stays_open(no_auth, capsys, host):
    """Past the check: serve goes on to the database (unreachable here, so it stops there)."""
    assert main(["serve", "--host", host, "--port", "1"]) == 2
    err = capsys.readouterr().err
    assert REFUSED not in err and "cannot reach the database" in err


def test_an_auth_file_allows_a_public_host(no_auth, monkeypatch, tmp_path, capsys):
    path = tmp_path / "users.yaml"
    auth.add_user(path, "ed", "editor", "editor-pass")
    monkeypatch.setenv(auth.ENV, str(path))
    assert main(["serve", "--host", "0.0.0.0", "--port", "1"]) == 2
    captured = capsys.readouterr()
    assert f"logins required: 1 user(s) in {path}" in captured.out
    assert REFUSED not in captured.err and "cannot reach the database" in captured.err


def test_the_opt_out_is_loud(no_auth, capsys):
    assert main(["serve", "--host", "0.0.0.0", "--port", "1", "--insecure-no-login"]) == 2
    err = capsys.readouterr().err
    assert "WARNING: serving 0.0.0.0 without logins (--insecure-no-login)" in err
    assert "cannot reach the database" in err  # it went on


def test_a_name_is_loopback_only_if_all_its_addresses_are(monkeypatch):
    def resolve(*addresses: str):
        return lambda *a, **k: [(socket.AF_INET, 0, 0, "", (ip, 0)) for ip in addresses]

    monkeypatch.setattr(socket, "getaddrinfo", resolve("127.0.0.1", "::1"))
    assert is_loopback("box")
    monkeypatch.setattr(socket, "getaddrinfo", resolve("127.0.0.1", "10.1.2.3"))
    assert not is_loopback("box")
    monkeypatch.setattr(socket, "getaddrinfo", resolve("192.168.1.20"))
    assert not is_loopback("box")


def raises_with_a_secret() -> None:
    raise RuntimeError("secret-detail at /srv/private/path")


def test_the_served_dashboard_shows_no_error_details():
    """The option as `eslab serve` passes it to Streamlit, applied to a page that fails:
    the browser gets a generic message, no type, message or traceback."""
    command = dashboard_command("127.0.0.1", 8501)
    value = command[command.index("--client.showErrorDetails") + 1]
    before = st_config.get_option("client.showErrorDetails")
    st_config.set_option("client.showErrorDetails", value)
    try:
        at = AppTest.from_function(raises_with_a_secret).run()
    finally:
        st_config.set_option("client.showErrorDetails", before)
    shown = at.exception[0]
    assert "secret-detail" not in shown.value and "RuntimeError" not in shown.value
    assert not shown.stack_trace


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("ESLAB_MAX_UPLOAD_MB", "lots"),
        ("ESLAB_HEARTBEAT_TIMEOUT_S", "x"),
        ("ESLAB_TRUSTED_PROXIES", "127.0.0.1,proxy.lab"),
    ],
)
def test_a_malformed_setting_stops_serve_in_one_line(no_auth, monkeypatch, capsys, variable, value):
    monkeypatch.setenv(variable, value)
    assert main(["serve", "--port", "1"]) == 2
    err = capsys.readouterr().err
    assert variable in err and repr(value.split(",")[-1]) in err and "database" not in err


def test_the_dashboard_starts_from_a_streamlit_outside_site_packages(tmp_path):
    """Streamlit takes a copy outside site-packages (`pip install --target DIR`, as on the
    GPU machine) for its own development checkout and then refuses --server.port; the
    dashboard's command must start there all the same."""
    import streamlit

    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "streamlit").symlink_to(Path(streamlit.__file__).parent)
    app = tmp_path / "app.py"
    app.write_text("import streamlit as st\nst.write('up')\n")
    port = free_port()
    command = dashboard_command("127.0.0.1", port)
    command[command.index("run") + 1] = str(app)
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site")}
    log = tmp_path / "streamlit.log"
    with log.open("w") as out:
        process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and process.poll() is None:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.2)
        assert process.poll() is None, log.read_text()
        assert "developmentMode" not in log.read_text()
    finally:
        process.terminate()
        process.wait(30)
