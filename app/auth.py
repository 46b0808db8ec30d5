"""Who may use the dashboard: with ESLAB_AUTH_FILE set, a login is required and only editors
may launch, cancel, clone, resume or delete runs; without it the dashboard is open (one local
user, who is an editor), which `eslab serve` allows on loopback only (app/cli/serve.py).

The file (YAML, or TOML when it ends in .toml) maps user names to a role and a salted scrypt
hash, never a password:

    users:
      alice: {role: editor, password: "scrypt$16384$8$1$<salt b64>$<hash b64>"}

`eslab users add/list/remove` writes it. The check that matters is `require_editor`, called
by the functions in app/actions.py that do the work, so a hidden button is a convenience and
not the protection.

A login lasts as long as its browser tab, but the rights do not: every check reads the user's
role from the file again (a stat per check; the file is parsed only when it changed), so a
user who is removed, demoted or given a new password loses the rights at their next action."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import secrets
import tempfile
import threading
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

import yaml

ENV = "ESLAB_AUTH_FILE"
ROLES = ("viewer", "editor")
SESSION_KEY = "auth_user"
# scrypt at n=2**14, r=8, p=1 takes ~16 MiB and tens of milliseconds: cheap for one login,
# costly for a guesser (the parameters travel in each hash, so they can be raised later).
SCRYPT_N, SCRYPT_R, SCRYPT_P = 2**14, 8, 1
MIN_PASSWORD = 8


class AuthError(Exception):
    """The auth file is missing or malformed, or a user operation was refused."""


class PermissionDenied(AuthError):
    """A viewer (or nobody) asked for an editor's action."""


@dataclass(frozen=True)
class User:
    name: str
    role: str
    password_hash: str = ""

    @property
    def is_editor(self) -> bool:
        return self.role == "editor"


LOCAL_USER = User("local", "editor")  # everyone, when no auth file is configured


@dataclass(frozen=True)
class Session:
    """What a browser tab keeps after a login: the name and a fingerprint of the password
    hash it logged in with, never the role (read from the file at each check) nor the hash."""

    name: str
    stamp: str


def signed_in(user: User) -> Session:
    """The session value of `user` (a User of the file, with its hash) after a login."""
    return Session(user.name, _stamp(user.password_hash))


def _stamp(password_hash: str) -> str:
    return hashlib.sha256(password_hash.encode()).hexdigest()


# -- passwords ----------------------------------------------------------------------------


def hash_password(password: str) -> str:
    """A salted scrypt hash with its parameters: `scrypt$N$r$p$salt$hash` (base64 parts)."""
    if len(password) < MIN_PASSWORD:
        raise AuthError(
            f"the password must have at least {MIN_PASSWORD} characters, got {len(password)}"
        )
    salt = secrets.token_bytes(16)
    digest = hashlib.scrypt(password.encode(), salt=salt, n=SCRYPT_N, r=SCRYPT_R, p=SCRYPT_P)
    b64 = base64.b64encode
    return f"scrypt${SCRYPT_N}${SCRYPT_R}${SCRYPT_P}${b64(salt).decode()}${b64(digest).decode()}"


def verify_password(password: str, stored: str) -> bool:
    """True when `password` hashes to `stored`; False for a wrong password or a hash this
    module cannot read (never an exception for a login attempt)."""
    try:
        scheme, n, r, p, salt, digest = stored.split("$")
        if scheme != "scrypt":
            return False
        expected = base64.b64decode(digest, validate=True)
        actual = hashlib.scrypt(
            password.encode(),
            salt=base64.b64decode(salt, validate=True),
            n=int(n),
            r=int(r),
            p=int(p),
            dklen=len(expected),
        )
    except (ValueError, TypeError):
        return False
    return hmac.compare_digest(actual, expected)


# -- the file -----------------------------------------------------------------------------


def auth_path() -> Path | None:
    value = os.environ.get(ENV, "").strip()
    return Path(value) if value else None


def load_users(path: Path) -> dict[str, User]:
    """The users of `path`; AuthError naming the file and what is wrong with it."""
    if not path.is_file():
        raise AuthError(
            f"{ENV} names {path}, which does not exist; create it with "
            "`eslab users add NAME --role editor`"
        )
    try:
        text = path.read_text()
        data = tomllib.loads(text) if path.suffix == ".toml" else yaml.safe_load(text)
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, yaml.YAMLError) as exc:
        raise AuthError(f"auth file {path}: cannot be read: {' '.join(str(exc).split())}") from exc
    if data is None:
        data = {"users": {}}
    if not isinstance(data, dict) or not isinstance(data.get("users", {}), dict):
        raise AuthError(
            f"auth file {path}: must hold a mapping `users: {{NAME: {{role: ..., "
            "password: ...}}}}`"
        )
    users = {}
    for name, entry in (data.get("users") or {}).items():
        where = f"auth file {path}: user {name!r}"
        if not isinstance(entry, dict):
            raise AuthError(f"{where}: must be a mapping with role and password")
        role, hashed = entry.get("role"), entry.get("password")
        if role not in ROLES:
            raise AuthError(f"{where}: role must be one of {', '.join(ROLES)}, got {role!r}")
        if (
            not isinstance(hashed, str)
            or not hashed.startswith("scrypt$")
            or hashed.count("$") != 5
        ):
            raise AuthError(
                f"{where}: password must be a scrypt hash written by `eslab users "
                "add` (plain passwords are refused)"
            )
        users[str(name)] = User(str(name), role, hashed)
    return users


# The file parsed once per version: (path) -> ((inode, size, mtime, ctime), users).
_cache: dict[str, tuple[tuple[int, int, int, int], dict[str, User]]] = {}
_cache_lock = threading.Lock()
# A file changed this recently may change again within the file system's timestamp
# granularity without its stat changing, so it is not cached yet (git's "racily clean" rule).
RACY_S = 2.0


def cached_users(path: Path) -> dict[str, User]:
    """load_users(path), parsed again only when the file's inode, size, mtime or ctime
    changed: every role check calls it, so a check costs one stat."""
    try:
        st = path.stat()
    except OSError:
        return load_users(path)  # its message says the file is missing
    version = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    with _cache_lock:
        hit = _cache.get(str(path))
        if hit is not None and hit[0] == version:
            return hit[1]
        users = load_users(path)
        if time.time() - max(st.st_mtime_ns, st.st_ctime_ns) / 1e9 > RACY_S:
            _cache[str(path)] = (version, users)
        else:
            _cache.pop(str(path), None)
        return users


def save_users(path: Path, users: dict[str, User]) -> None:
    """Write `users` to `path` (YAML, or TOML for .toml), readable by its owner only. The
    new text replaces the file in one step, so the dashboard never reads half a file."""
    entries = {
        u.name: {"role": u.role, "password": u.password_hash}
        for u in sorted(users.values(), key=lambda u: u.name)
    }
    if path.suffix == ".toml":
        # Names and hashes are plain strings; JSON string escapes are valid TOML ones.
        text = "".join(
            f"[users.{json.dumps(name)}]\nrole = {json.dumps(e['role'])}\n"
            f"password = {json.dumps(e['password'])}\n\n"
            for name, e in entries.items()
        )
    else:
        text = yaml.safe_dump({"users": entries}, sort_keys=True)
    target = Path(os.path.realpath(path))  # a link to the file stays a link
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")  # mode 0600
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, target)
    except BaseException:
        os.unlink(temp)
        raise


def add_user(path: Path, name: str, role: str, password: str) -> User:
    """Add `name` or replace its role and password."""
    if role not in ROLES:
        raise AuthError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
    if not name or any(c.isspace() for c in name):
        raise AuthError(f"user name must be non-empty without spaces, got {name!r}")
    users = load_users(path) if path.exists() else {}
    users[name] = User(name, role, hash_password(password))
    save_users(path, users)
    return users[name]


def remove_user(path: Path, name: str) -> None:
    users = load_users(path)
    if name not in users:
        raise AuthError(f"auth file {path}: no user {name!r} (users: {', '.join(users) or 'none'})")
    del users[name]
    save_users(path, users)


def authenticate(users: dict[str, User], name: str, password: str) -> User | None:
    user = users.get(name)
    if user is None:
        verify_password(password, _DUMMY_HASH)  # about the same time for unknown names
        return None
    return user if verify_password(password, user.password_hash) else None


_DUMMY_HASH = hash_password("not-a-password")


# -- the dashboard session ----------------------------------------------------------------


def session_user(path: Path, session: object) -> User | None:
    """The user `session` stands for now, with the role the file gives them now; None when
    they were removed or their password changed since the login; AuthError when the file
    cannot be read."""
    if not isinstance(session, Session):
        return None
    user = cached_users(path).get(session.name)
    if user is None or not hmac.compare_digest(session.stamp, _stamp(user.password_hash)):
        return None
    return User(user.name, user.role)


def current_user() -> User | None:
    """The logged-in user as the auth file has them now; LOCAL_USER when auth is off; None
    when nobody has logged in. A session whose user was removed or whose password changed
    ends here (the tab is asked to log in again); while the file cannot be read, nobody has
    rights, but sessions survive until it is fixed."""
    import streamlit as st

    path = auth_path()
    if path is None:
        return LOCAL_USER
    session = st.session_state.get(SESSION_KEY)
    if session is None:
        return None
    try:
        user = session_user(path, session)
    except AuthError:
        return None
    if user is None:
        st.session_state.pop(SESSION_KEY, None)
    return user


def can_edit() -> bool:
    user = current_user()
    return user is not None and user.is_editor


def require_editor(action: str) -> User:
    """The current user when they may `action` (e.g. "cancel runs"); PermissionDenied with
    a message saying who they are and who may, otherwise. The role is the auth file's at
    this moment, not the one the user had when they logged in."""
    user = current_user()
    if user is None:
        raise PermissionDenied(f"log in as an editor to {action}")
    if not user.is_editor:
        raise PermissionDenied(f"{user.name} is a {user.role}: only editors may {action}")
    return user
