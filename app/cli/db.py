"""`eslab db upgrade | downgrade | current`: the database's Alembic migrations."""

from __future__ import annotations

import argparse


def add_commands(commands: argparse._SubParsersAction) -> None:
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


def cmd_db_upgrade(args: argparse.Namespace) -> int:
    from jobs.store.migrate import upgrade

    upgrade(revision=args.revision)
    return cmd_db_current(args)


def cmd_db_downgrade(args: argparse.Namespace) -> int:
    from jobs.store.migrate import downgrade

    downgrade(revision=args.revision)
    return cmd_db_current(args)


def cmd_db_current(args: argparse.Namespace) -> int:
    from jobs.store.database import database_url, describe, make_engine
    from jobs.store.migrate import current_revision, head_revision

    engine = make_engine()
    try:
        current = current_revision(engine)
    finally:
        engine.dispose()
    print(f"{describe(database_url())}: migration {current or 'none'} (latest {head_revision()})")
    return 0
