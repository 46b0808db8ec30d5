"""The `eslab` command. Each command group is a module here that adds its subcommands with
`add_commands`; each subcommand is a thin function over engine/ and jobs/, which it imports
only when it runs so that `eslab --help` stays fast. Errors of those layers become one line
on stderr and exit code 2, never a traceback."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence

from app.cli import (
    bon,
    data,
    db,
    export,
    kl,
    model,
    presets,
    runs,
    scorer,
    serve,
    sweeps,
    train,
    users,
)
from app.cli.common import USER_ERRORS, print_error

COMMAND_GROUPS = (
    serve,
    runs,
    sweeps,
    export,
    train,
    presets,
    data,
    model,
    db,
    users,
    scorer,
    bon,
    kl,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="eslab",
        description="ES Lab: fine-tune language models with Evolution Strategies (ES, LBES).",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for group in COMMAND_GROUPS:
        group.add_commands(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    from app.auth import AuthError

    try:
        return func(args)
    except (*USER_ERRORS, AuthError) as exc:
        # Driver messages span lines; a user gets one line that names what and what to run.
        print_error(" ".join(str(exc).split()))
        return 2
