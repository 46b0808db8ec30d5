"""Where the scorer token goes, and what of a reply reaches an error: the token only to a
loopback scorer or an origin of ESLAB_SCORER_ORIGINS (scorer_url is an editor's text), and
errors give the status and the URL, never the reply's text. httpx is replaced by a recorder:
nothing leaves the process."""

from __future__ import annotations

import httpx
import pytest

from engine.scoring.client import ORIGINS_ENV, TOKEN_ENV, ScorerClient, ScorerError, token_allowed

TOKEN = "t0ken-" + "x" * 20
SECRET_PAGE = "internal-admin-page: db password hunter2"


@pytest.fixture
def sent(monkeypatch):
    """The headers of every request; each answers `sent.reply` (status, body)."""

    class Recorder(list):
        reply = (200, b'{"rewards": [1.0], "costs": [0.0]}')

        def request(self, url: str, headers: dict, **_: object) -> httpx.Response:
            self.append((url, headers))
            status, body = self.reply
            return httpx.Response(status, content=body, request=httpx.Request("POST", url))

    recorder = Recorder()
    monkeypatch.setattr(httpx, "post", recorder.request)
    monkeypatch.setattr(httpx, "get", recorder.request)
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    monkeypatch.delenv(ORIGINS_ENV, raising=False)
    return recorder


def authorization(sent: list) -> list[str | None]:
    return [headers.get("Authorization") for _, headers in sent]


@pytest.mark.parametrize(
    "url",
    ["http://127.0.0.1:8000", "http://localhost:8000/", "http://[::1]:8000", "http://127.0.0.2"],
)
def test_a_loopback_scorer_gets_the_token(sent, url):
    ScorerClient(url).score(["p"], ["r"])
    ScorerClient(url).health()
    assert authorization(sent) == [f"Bearer {TOKEN}"] * 2


@pytest.mark.parametrize(
    "url",
    [
        "http://attacker.example:8000",
        "http://10.0.0.5:8000",
        "http://127.0.0.1@attacker.example:8000",  # user info, not the host
        "http://attacker.example\\@127.0.0.1:8000/.",  # the host httpx sends to is what counts
        "http://localhost.attacker.example:8000",
    ],
)
def test_the_token_never_goes_to_a_scorer_nobody_allowed(sent, url):
    sent.reply = (200, b'{"status": "ok"}')
    ScorerClient(url).health()
    expected_host = httpx.URL(url).host
    assert [httpx.URL(u).host for u, _ in sent] == [expected_host]
    if expected_host == "127.0.0.1":
        assert authorization(sent) == [f"Bearer {TOKEN}"]  # loopback after all, by httpx too
    else:
        assert authorization(sent) == [None]


def test_an_origin_the_operator_lists_gets_the_token(sent, monkeypatch):
    monkeypatch.setenv(ORIGINS_ENV, "https://scorer.lab, http://Scorer.Lab:8000/")
    for url in ("https://scorer.lab:443/", "http://scorer.lab:8000", "HTTP://SCORER.LAB:8000"):
        ScorerClient(url).score(["p"], ["r"])
    for url in ("http://scorer.lab", "https://scorer.lab:8000", "http://scorer.lab:8001"):
        ScorerClient(url).score(["p"], ["r"])  # another port or scheme is another origin
    assert authorization(sent) == [f"Bearer {TOKEN}"] * 3 + [None] * 3


@pytest.mark.parametrize(
    "entry", ["scorer.lab:8000", "http://scorer.lab/api", "ftp://x", "http://"]
)
def test_a_listed_entry_that_is_no_origin_is_named(monkeypatch, entry):
    monkeypatch.setenv(ORIGINS_ENV, entry)
    with pytest.raises(ScorerError, match=f"{ORIGINS_ENV} entry '.*' is not an origin"):
        token_allowed("http://elsewhere.example")


def test_a_401_from_a_scorer_nobody_allowed_says_how_to_allow_it(sent):
    sent.reply = (401, b"")
    with pytest.raises(ScorerError, match=f"HTTP 401; {TOKEN_ENV} is set but .*{ORIGINS_ENV}"):
        ScorerClient("http://scorer.lab:8000", retries=0).score(["p"], ["r"])


@pytest.mark.parametrize(
    ("status", "body", "message"),
    [
        (403, SECRET_PAGE.encode(), "refused the batch: HTTP 403$"),
        (200, SECRET_PAGE.encode(), r"malformed JSON \(\d+ bytes\)"),
        (200, b'{"rewards": [1.0], "note": "' + SECRET_PAGE.encode() + b'"}', "list 'costs'$"),
        (200, b'{"rewards": ["' + SECRET_PAGE.encode() + b'"], "costs": [0]}', r"\[0\] = a str"),
    ],
)
def test_errors_never_echo_the_reply(sent, status, body, message):
    sent.reply = (status, body)
    url = "http://intranet.example:80"
    with pytest.raises(ScorerError, match=message) as info:
        ScorerClient(url, retries=0).score(["p"], ["r"])
    assert url in str(info.value)
    assert "hunter2" not in str(info.value)


def test_a_5xx_reply_is_not_echoed_either(sent, monkeypatch):
    monkeypatch.setattr("engine.scoring.client.RETRY_PAUSE_S", 0.0)
    sent.reply = (500, SECRET_PAGE.encode())
    with pytest.raises(ScorerError, match=r"failed 2 time\(s\): HTTP 500$") as info:
        ScorerClient("http://intranet.example:80", retries=1).score(["p"], ["r"])
    assert "hunter2" not in str(info.value)
