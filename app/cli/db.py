"""`eslab db upgrade | downgrade | current`: the database's Alembic migrations; `eslab db
backup | restore`: a copy of it taken while runs write, and its return (jobs.store.backup)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_commands(commands: argparse._SubParsersAction) -> None:
    db = commands.add_parser(
        "db", help="database migrations and backups (ESLAB_DATABASE_URL or data/eslab.db)"
    )
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
    copies = (
        (
            "backup",
            "a consistent copy of the database, taken while runs write (SQLite: one file; "
            "PostgreSQL: pg_dump's custom format)",
            "replace FILE if it exists",
            cmd_db_backup,
        ),
        (
            "restore",
            "bring a backup back into the database (stop `eslab serve` first); refused "
            "where the database has runs, unless --force",
            "replace the runs the database holds",
            cmd_db_restore,
        ),
    )
    for name, summary, force_help, func in copies:
        command = db_cmds.add_parser(name, help=summary)
        command.add_argument("file", metavar="FILE", type=Path)
        command.add_argument("--force", action="store_true", help=force_help)
        command.set_defaults(func=func)


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


def cmd_db_backup(args: argparse.Namespace) -> int:
    from jobs.store.backup import backup_database
    from jobs.store.database import database_url, describe

    size = backup_database(args.file, force=args.force)
    print(f"{describe(database_url())}: backed up to {args.file} ({size:,} bytes)")
    return 0


def cmd_db_restore(args: argparse.Namespace) -> int:
    from jobs.store.backup import restore_database

    problem = restore_database(args.file, force=args.force)
    print(f"restored {args.file}")
    cmd_db_current(args)
    if problem:
        print(f"eslab: warning: {' '.join(problem.split())}", file=sys.stderr)
    return 0
