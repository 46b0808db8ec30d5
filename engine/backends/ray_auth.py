"""Ray's token authentication for the clusters that ES Lab starts and uses.

Whoever can send a job to a Ray cluster runs code as the user who started it. Ray (2.52+)
checks a bearer token on its job API, dashboard and gRPC servers, but only in token mode
(`RAY_AUTH_MODE=token`), which `ray start --head` leaves off: a head that `eslab serve` started
without a token in the environment took jobs from anyone on the network. So ES Lab starts its
own heads, and talks to a `RAY_ADDRESS` cluster, only in token mode, and refuses to go on when
that mode would end up off, unless the operator opts out (`eslab serve --insecure-ray-no-token`).

The token is Ray's own: `RAY_AUTH_TOKEN`, else the file `RAY_AUTH_TOKEN_PATH`, else
`~/.ray/auth_token`, which is created (readable by this user only) when none of the three
exists, so that Ray's own commands (`ray job list`, `ray status`) find it too.
"""

from __future__ import annotations

import os
import secrets
import stat
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

MODE_SETTING = "RAY_AUTH_MODE"
TOKEN_SETTING = "RAY_AUTH_TOKEN"
TOKEN_PATH_SETTING = "RAY_AUTH_TOKEN_PATH"
NO_TOKEN_FLAG = "--insecure-ray-no-token"
LOOPBACK_ONLY_SETTING = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
"""Ray's switch between a single-machine node (off: every server of the node binds 127.0.0.1,
as Ray does on macOS and Windows) and a cluster node (on: it binds all interfaces, and its
address is the machine's network address). ES Lab's own head is a single machine's."""


class RayAuthError(Exception):
    """Ray would run without token authentication, or its token is unusable; the message
    says how to fix it."""


def token_path() -> Path:
    """Where Ray reads its token from when RAY_AUTH_TOKEN is not set."""
    explicit = os.environ.get(TOKEN_PATH_SETTING)
    return Path(explicit).expanduser() if explicit else Path.home() / ".ray" / "auth_token"


def ensure_token() -> Path | None:
    """The token file Ray will read (None when RAY_AUTH_TOKEN holds the token itself), made
    when Ray's default file does not exist. A file that other users of the machine can read
    is refused: its token opens the cluster to all of them."""
    if os.environ.get(TOKEN_SETTING, "").strip():
        return None
    path = token_path()
    if not path.exists():
        if os.environ.get(TOKEN_PATH_SETTING):
            raise RayAuthError(
                f"{TOKEN_PATH_SETTING} names {path}, which does not exist; write a token "
                f"there (`ray get-auth-token --generate` prints one) or unset {TOKEN_PATH_SETTING}"
            )
        _create_token_file(path)
    _keep_private(path)
    if not path.read_text().strip():
        raise RayAuthError(f"Ray's token file {path} is empty; remove it to get a new token")
    return path


def _keep_private(path: Path) -> None:
    """Ray's own `ray.init()` writes its token with the umask's mode (0644 as a rule): this
    user's file is made 0600, with a warning, since others may have read it already; a file of
    another user's is refused."""
    info = path.stat()
    if not info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        return
    if info.st_uid != os.getuid():
        raise RayAuthError(
            f"Ray's token file {path} belongs to another user and others can read it; the "
            f"token runs code on the cluster as you: use a file of your own ({TOKEN_PATH_SETTING})"
        )
    path.chmod(0o600)
    print(
        f"WARNING: Ray's token file {path} was readable by other users of this machine: made it "
        "0600; if they could log in, make a new token (remove the file and restart)",
        file=sys.stderr,
        flush=True,
    )


def _create_token_file(path: Path) -> None:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:  # O_EXCL: a token another process wrote meanwhile is kept, not overwritten
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return
    with os.fdopen(fd, "w") as file:
        file.write(secrets.token_hex(32))
    print(f"made a Ray token for this user in {path}", flush=True)


@contextmanager
def local_cluster() -> Iterator[None]:
    """Around a `ray.init()` that starts a Ray cluster in this process (a foreground run's
    engines): token mode, and every server of the node on 127.0.0.1. Ray reads its
    single-machine switch once, when it is first imported, so a process that has imported Ray
    already is switched as well. The switch is put back afterwards (the node's processes keep
    it): left in the environment, a `ray start` this process runs later to join a cluster of
    several machines refuses to ("Multi-node Ray clusters are not supported")."""
    require_token_mode()
    try:
        from ray._private import ray_constants
    except ImportError:
        yield
        return
    before_env, before_constant = (
        os.environ.get(LOOPBACK_ONLY_SETTING),
        ray_constants.ENABLE_RAY_CLUSTER,
    )
    os.environ[LOOPBACK_ONLY_SETTING] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = before_constant
        if before_env is None:
            os.environ.pop(LOOPBACK_ONLY_SETTING, None)
        else:
            os.environ[LOOPBACK_ONLY_SETTING] = before_env


def require_token_mode() -> None:
    """Token mode for this process and every process it starts (the head, the dashboard,
    the runs' jobs inherit the environment), with a token in place. Raises RayAuthError
    when the operator's environment switches it off."""
    mode = os.environ.get(MODE_SETTING, "").strip().lower()
    if mode and mode != "token":
        raise RayAuthError(
            f"{MODE_SETTING}={mode} would run Ray without token authentication: anyone who "
            f"can reach its ports could run code as this user. Unset {MODE_SETTING} (ES Lab "
            f"then uses token mode), or pass {NO_TOKEN_FLAG} if every user of this machine "
            "and its network is trusted"
        )
    ensure_token()
    os.environ[MODE_SETTING] = "token"
    _reload_ray_settings()


def _reload_ray_settings() -> None:
    """Ray reads RAY_AUTH_MODE and the token once per process and caches them; a process
    that already asked (an earlier client) would go on sending no token."""
    try:
        from ray._raylet import AuthenticationTokenLoader, Config
    except ImportError:  # a Ray without token authentication: nothing cached
        return
    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


def refuse_open_cluster(dashboard_url: str) -> None:
    """Raises RayAuthError when Ray's job API at `dashboard_url` lists jobs for a request
    that carries no token, as a cluster without token authentication does (one that checks
    answers 401). Only an HTTP address can be asked; an unreachable one is left to the first
    real request, which names it."""
    if not dashboard_url.startswith(("http://", "https://")):
        return
    request = urllib.request.Request(f"{dashboard_url.rstrip('/')}/api/jobs/")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            anonymous_answered = response.status == 200
    except OSError:  # an HTTP error (401, 403: it checks tokens) or no answer at all
        return
    if anonymous_answered:
        raise RayAuthError(
            f"the Ray cluster at {dashboard_url} takes jobs from requests that carry no "
            "token, so anyone who can reach it can run code there. Start every node of it "
            f"with {MODE_SETTING}=token and this user's token ({token_path()}, or "
            f"{TOKEN_SETTING}), or pass {NO_TOKEN_FLAG} if its network is trusted"
        )
