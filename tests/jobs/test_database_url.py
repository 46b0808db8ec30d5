"""A database URL is never shown with its password, and a URL that cannot work is one line
that names the setting, from every command that opens the database."""

from __future__ import annotations

import pytest
from sqlalchemy.engine import make_url

from app.cli import main
from jobs.store.database import describe, parse_url

SECRET = "s3cret-pw"

BAD_URLS = {
    f"postgresql+psycopg://u:{SECRET}@127.0.0.1:99999/db": "the port 99999 is not a number",
    f"postgresql+psycopg://u:{SECRET}@127.0.0.1:abc/db": "the port is not a number",
    f"postgresql+psycopg://u:{SECRET}@127.0.0.1:0/db": "the port 0 is not a number",
    f"u:{SECRET}@host/db": "is not a database URL",
    # a password holding a raw `@`: SQLAlchemy alone would read `{SECRET}@127.0.0.1` as the host
    f"postgresql+psycopg://u:pw@{SECRET}@127.0.0.1:99999/db": "the port 99999 is not a number",
    f"nope://u:{SECRET}@host/db": "SQLAlchemy knows no database 'nope'",
}


@pytest.mark.parametrize("command", [["db", "current"], ["db", "upgrade"], ["runs"]])
@pytest.mark.parametrize("url", BAD_URLS)
def test_a_bad_database_url_is_one_line_without_the_password(url, command, monkeypatch, capsys):
    monkeypatch.setenv("ESLAB_DATABASE_URL", url)
    assert main(command) == 2
    out, err = capsys.readouterr()
    assert SECRET not in out + err
    assert len(err.strip().splitlines()) == 1
    assert "ESLAB_DATABASE_URL" in err and BAD_URLS[url] in err


@pytest.mark.parametrize(
    "url, shown",
    [
        (f"postgresql+psycopg://u:{SECRET}@h/db", "postgresql+psycopg://u:***@h/db"),
        (f"postgresql+psycopg://u@h/db?password={SECRET}", "postgresql+psycopg://u@h/db?password="),
        (f"postgresql+psycopg://u:{SECRET}@h:abc/db", "postgresql+psycopg://***@h:abc/db"),
        (f"u:{SECRET}@h/db", "***@h/db"),
        (f"postgresql+psycopg://u:pw@{SECRET}@h:5432/db", "postgresql+psycopg://u:***@h:5432/db"),
        (f"postgresql+psycopg://u:@{SECRET}@@h/db", "postgresql+psycopg://u:***@h/db"),
        (f"postgresql+psycopg://u:pw@{SECRET}@h:abc/db", "postgresql+psycopg://***@h:abc/db"),
    ],
)
def test_describe_hides_the_password_even_in_a_url_that_does_not_parse(url, shown):
    assert SECRET not in describe(url) and describe(url).startswith(shown)


def test_a_raw_at_sign_belongs_to_the_password_not_the_host():
    parsed = parse_url(f"postgresql+psycopg://u:pw@{SECRET}@h:5432/db")
    assert (parsed.username, parsed.password, parsed.host, parsed.port) == (
        "u",
        f"pw@{SECRET}",
        "h",
        5432,
    )


def test_the_db_commands_never_echo_a_password(postgres, monkeypatch, capsys):
    """PostgreSQL's test server trusts every login, so any password connects."""
    if isinstance(postgres, str):
        pytest.skip(f"PostgreSQL unavailable: {postgres}")
    url = make_url(postgres.create_database()).set(password=SECRET)
    monkeypatch.setenv("ESLAB_DATABASE_URL", url.render_as_string(hide_password=False))
    for command, code in [
        (["db", "upgrade"], 0),
        (["db", "current"], 0),
        (["runs"], 0),
        (["db", "downgrade"], 0),
        (["runs"], 2),  # refused: an older migration
    ]:
        assert main(command) == code
    out, err = capsys.readouterr()
    assert SECRET not in out + err
    assert "eslab:***@" in out and "eslab:***@" in err


def test_a_password_with_a_raw_at_sign_connects_and_is_never_shown(postgres, monkeypatch, capsys):
    """The server trusts every login: connecting proves the host is read as the host."""
    if isinstance(postgres, str):
        pytest.skip(f"PostgreSQL unavailable: {postgres}")
    url = make_url(postgres.create_database())
    raw = f"{url.drivername}://{url.username}:pw@{SECRET}@{url.host}:{url.port}/{url.database}"
    monkeypatch.setenv("ESLAB_DATABASE_URL", raw)
    assert main(["db", "upgrade"]) == 0
    assert main(["db", "current"]) == 0
    out, err = capsys.readouterr()
    assert SECRET not in out + err
    assert f"{url.username}:***@{url.host}" in out
