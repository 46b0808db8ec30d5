"""`eslab users add | list | remove`: dashboard logins in the auth file (app/auth.py);
viewers look, editors act."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from app.cli.common import print_error


def add_commands(commands: argparse._SubParsersAction) -> None:
    users = commands.add_parser(
        "users", help="dashboard logins (ESLAB_AUTH_FILE): viewers look, editors act"
    )
    users.add_argument("--file", help="auth file, YAML or .toml (default: $ESLAB_AUTH_FILE)")
    users_cmds = users.add_subparsers(dest="users_command", required=True, metavar="ACTION")
    users_add = users_cmds.add_parser("add", help="add a user or change their role/password")
    users_add.add_argument("name")
    users_add.add_argument("--role", choices=("viewer", "editor"), required=True)
    users_add.add_argument(
        "--password-stdin",
        action="store_true",
        help="read the password from stdin instead of asking",
    )
    users_add.set_defaults(func=cmd_users_add)
    users_cmds.add_parser("list", help="names and roles").set_defaults(func=cmd_users_list)
    users_remove = users_cmds.add_parser("remove", help="delete a user")
    users_remove.add_argument("name")
    users_remove.set_defaults(func=cmd_users_remove)


def _auth_file(args: argparse.Namespace) -> Path:
    from app.auth import ENV, AuthError, auth_path

    path = Path(args.file) if args.file else auth_path()
    if path is None:
        raise AuthError(f"no auth file: pass --file PATH or set {ENV}")
    return path


def cmd_users_add(args: argparse.Namespace) -> int:
    """Add a user (or replace their role and password); the password is read without echo,
    or from the first line of stdin with --password-stdin, and only its hash is stored."""
    import getpass

    from app.auth import add_user

    path = _auth_file(args)
    if args.password_stdin:
        password = sys.stdin.readline().rstrip("\n")
    else:
        password = getpass.getpass(f"password for {args.name}: ")
        if getpass.getpass("again: ") != password:
            print_error("the passwords differ; nothing changed")
            return 2
    user = add_user(path, args.name, args.role, password)
    print(f"{user.name} ({user.role}) saved in {path}")
    return 0


def cmd_users_list(args: argparse.Namespace) -> int:
    from app.auth import load_users

    path = _auth_file(args)
    for user in load_users(path).values():
        print(f"{user.name}\t{user.role}")
    return 0


def cmd_users_remove(args: argparse.Namespace) -> int:
    from app.auth import remove_user

    path = _auth_file(args)
    remove_user(path, args.name)
    print(f"{args.name} removed from {path}")
    return 0
