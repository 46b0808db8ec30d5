"""Who may use the dashboard: with ESLAB_AUTH_FILE set, a login is required and only editors
may launch, cancel, clone, resume or delete runs; without it the dashboard is open (one local
user, who is an editor).

The file (YAML, or TOML when it ends in .toml) maps user names to a role and a salted scrypt
hash, never a password:

    users:
      alice: {role: editor, password: "scrypt$16384$8$1$<salt b64>$<hash b64>"}

`eslab users add/list/remove` writes it. The check that matters is `require_editor`, called
by the functions in app/actions.py that do the work, so a hidden button is a convenience and
not the protection."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import secrets
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


def save_users(path: Path, users: dict[str, User]) -> None:
    """Write `users` to `path` (YAML, or TOML for .toml), readable by its owner only."""
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
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch(mode=0o600, exist_ok=True)
    path.write_text(text)


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


def current_user() -> User | None:
    """The logged-in user; LOCAL_USER when auth is off; None when nobody has logged in."""
    import streamlit as st

    if auth_path() is None:
        return LOCAL_USER
    return st.session_state.get(SESSION_KEY)


def can_edit() -> bool:
    user = current_user()
    return user is not None and user.is_editor


def require_editor(action: str) -> User:
    """The current user when they may `action` (e.g. "cancel runs"); PermissionDenied with
    a message saying who they are and who may, otherwise."""
    user = current_user()
    if user is None:
        raise PermissionDenied(f"log in as an editor to {action}")
    if not user.is_editor:
        raise PermissionDenied(f"{user.name} is a {user.role}: only editors may {action}")
    return user
