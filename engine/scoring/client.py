"""The training side of the scorer: batched, time-limited, retried calls to `/score_batch`.

The jbejjani2022 fork's client returned zeros for every sample on any HTTP error, which ES
then optimises as if it were a score. Here every failure — the service down, slower than the
timeout, an HTTP error, malformed JSON, lists of the wrong length or non-finite numbers —
raises ScorerError naming the scorer URL, after `retries` further attempts for the transient
kinds (connection refused, timeout, 5xx).

A scorer that listens beyond loopback requires a token (`eslab scorer serve`): with
ESLAB_SCORER_TOKEN set in the training process's environment, a call sends it as a bearer
token, but only to a scorer on loopback or at an origin the operator lists in
ESLAB_SCORER_ORIGINS: `scorer_url` is an editor's text, and the token must not go wherever an
editor points it. Unset, calls go without one, as the reference's clients do against a scorer
on 127.0.0.1. It is read at call time, never stored in the client that tasks carry to Ray.

Errors give the status code and the scorer's URL, never the reply's text: an editor could
otherwise aim `scorer_url` at another service on the network and read its pages in the run's
error.
"""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from engine.hosts import is_loopback_address

if TYPE_CHECKING:
    import httpx

log = logging.getLogger(__name__)

RETRY_PAUSE_S = 0.5
MAX_RETRY_PAUSE_S = 30.0
"""Retries wait 0.5, 1, 2, ... s, at most 30: the default 8 retries outlast about 90 s of a
scorer that is away (restarting, loading its models)."""
TOKEN_ENV = "ESLAB_SCORER_TOKEN"
ORIGINS_ENV = "ESLAB_SCORER_ORIGINS"


class ScorerError(Exception):
    """The scorer service could not score a batch; the message names its URL."""


class _Transient(Exception):
    pass


@dataclass(frozen=True)
class ScorerClient:
    """Picklable settings (tasks carry it to Ray actors); each call opens its own connection."""

    url: str
    batch_size: int = 16
    timeout_s: float = 60.0
    retries: int = 8

    @property
    def base(self) -> str:
        return self.url.rstrip("/")

    def health(self) -> dict:
        """GET /health; raises ScorerError when the service does not answer ok."""
        import httpx

        try:
            response = httpx.get(
                f"{self.base}/health", headers=_auth(self.base), timeout=self.timeout_s
            )
            response.raise_for_status()
            return response.json()
        except (httpx.HTTPError, ValueError) as exc:
            status = exc.response.status_code if isinstance(exc, httpx.HTTPStatusError) else 0
            what = f"HTTP {status}" if status else _describe(exc)
            fix = (
                _token_hint(status, self.base)
                or "start it with `eslab scorer serve` or fix scorer_url"
            )
            raise ScorerError(f"scorer {self.base} is not healthy: {what}; {fix}") from exc

    def score(self, prompts: list[str], responses: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """(rewards, costs), one each per pair, in batches of `batch_size`."""
        if len(prompts) != len(responses):
            raise ValueError(f"{len(prompts)} prompts but {len(responses)} responses")
        rewards: list[float] = []
        costs: list[float] = []
        for start in range(0, len(prompts), self.batch_size):
            r, c = self._score_with_retries(
                prompts[start : start + self.batch_size], responses[start : start + self.batch_size]
            )
            rewards += r
            costs += c
        return np.array(rewards, dtype=np.float64), np.array(costs, dtype=np.float64)

    def _score_with_retries(
        self, prompts: list[str], responses: list[str]
    ) -> tuple[list[float], list[float]]:
        for attempt in range(self.retries + 1):
            try:
                return self._score_once(prompts, responses)
            except _Transient as exc:
                if attempt == self.retries:
                    raise ScorerError(
                        f"scorer {self.base} failed {attempt + 1} time(s): {exc}"
                    ) from None
                pause = min(RETRY_PAUSE_S * 2**attempt, MAX_RETRY_PAUSE_S)
                log.warning("scorer %s: %s; trying again in %.1f s", self.base, exc, pause)
                time.sleep(pause)
        raise AssertionError("unreachable")

    def _score_once(
        self, prompts: list[str], responses: list[str]
    ) -> tuple[list[float], list[float]]:
        import httpx

        url = f"{self.base}/score_batch"
        try:
            response = httpx.post(
                url,
                json={"prompts": prompts, "responses": responses},
                headers=_auth(url),
                timeout=self.timeout_s,
            )
        except httpx.TimeoutException as exc:
            raise _Transient(
                f"no answer within the {self.timeout_s:g} s timeout ({type(exc).__name__})"
            ) from exc
        except httpx.HTTPError as exc:
            raise _Transient(_describe(exc)) from exc
        if response.status_code >= 500:
            raise _Transient(f"HTTP {response.status_code}")
        if response.status_code != 200:
            hint = _token_hint(response.status_code, url)
            raise ScorerError(
                f"scorer {url} refused the batch: HTTP {response.status_code}"
                + (f"; {hint}" if hint else "")
            )
        try:
            body = response.json()
        except ValueError:
            raise ScorerError(
                f"scorer {url} answered with malformed JSON ({len(response.content)} bytes)"
            ) from None
        return (
            self._floats(body, "rewards", len(prompts), url),
            self._floats(body, "costs", len(prompts), url),
        )

    @staticmethod
    def _floats(body: object, key: str, expected: int, url: str) -> list[float]:
        values = body.get(key) if isinstance(body, dict) else None
        if not isinstance(values, list):
            raise ScorerError(f"scorer {url} answered without a list {key!r}")
        if len(values) != expected:
            raise ScorerError(f"scorer {url} answered {len(values)} {key} for {expected} responses")
        for i, v in enumerate(values):
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
                shown = repr(v) if isinstance(v, float) else f"a {type(v).__name__}"
                raise ScorerError(
                    f"scorer {url} answered {key}[{i}] = {shown}, which is not a finite number"
                )
        return [float(v) for v in values]


def _describe(exc: Exception) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _auth(url: str) -> dict[str, str]:
    """The bearer token for `url`, or nothing: none is set, or `url` is not a scorer the
    operator trusts with it (token_allowed)."""
    token = os.environ.get(TOKEN_ENV, "").strip()
    return {"Authorization": f"Bearer {token}"} if token and token_allowed(url) else {}


def token_allowed(url: str) -> bool:
    """Whether the token may go to `url`: a loopback host (127.0.0.0/8, ::1 or localhost,
    never a name resolved here, which could change before the request) or an origin listed
    in ESLAB_SCORER_ORIGINS. The URL is read by httpx, the parser that sends the request."""
    parsed = _parse(url)
    if parsed is None:
        return False
    return is_loopback_address(parsed.host) or _origin(parsed) in allowed_origins()


def allowed_origins() -> set[tuple[str, str, int]]:
    """ESLAB_SCORER_ORIGINS as (scheme, host, port): origins such as http://scorer.lab:8000,
    separated by commas or spaces; an entry that is not one raises ScorerError naming it."""
    origins = set()
    for entry in os.environ.get(ORIGINS_ENV, "").replace(",", " ").split():
        parsed = _parse(entry)
        if parsed is None or parsed.path != "/" or parsed.query or parsed.userinfo:
            raise ScorerError(
                f"{ORIGINS_ENV} entry {entry!r} is not an origin: write scheme://host:port, "
                "such as http://scorer.lab:8000"
            )
        origins.add(_origin(parsed))
    return origins


def _parse(url: str) -> httpx.URL | None:
    """`url` as httpx reads it, or None when it is no http(s) URL with a host."""
    import httpx

    try:
        parsed = httpx.URL(url.strip())
    except (httpx.InvalidURL, TypeError):
        return None
    return parsed if parsed.scheme in _DEFAULT_PORTS and parsed.host else None


def _origin(parsed: httpx.URL) -> tuple[str, str, int]:
    return parsed.scheme, parsed.host.lower(), parsed.port or _DEFAULT_PORTS[parsed.scheme]


_DEFAULT_PORTS = {"http": 80, "https": 443}


def _token_hint(status: int, url: str) -> str:
    """What to do about a 401 (the scorer wants a token); "" for any other status."""
    if status != 401:
        return ""
    if os.environ.get(TOKEN_ENV, "").strip() and not token_allowed(url):
        return (
            f"{TOKEN_ENV} is set but is sent only to loopback and the origins listed in "
            f"{ORIGINS_ENV}: ask the operator to add this scorer's origin there"
        )
    state = "is not the scorer's token" if _auth(url) else "is not set"
    return f"{TOKEN_ENV} {state}: set it to the token the scorer was started with"
