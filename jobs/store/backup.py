"""`eslab db backup` and `eslab db restore`: a consistent copy of the database taken while
runs write to it, and its return.

SQLite: the online backup API (sqlite3.Connection.backup) copies the pages through a
connection that holds one read transaction for the whole copy. In WAL mode (ES Lab's) that
transaction sees one snapshot while the runs go on committing to the WAL, so the copy is the
database as it stood when the backup began, each step's rows all there or none. Without it,
SQLite starts the copy again after every commit of another connection, and under a run's
per-step commits it might never end.

PostgreSQL: pg_dump in its custom format (it reads one snapshot too) and pg_restore in one
transaction. The password reaches them in a 0600 password file (PGPASSFILE), never on
their command line, which `ps` shows to every user, nor in a message.

A file is written under a temporary name beside its destination and renamed once whole, so
a failure or a kill leaves the old file or none, never half of one. A restore replaces a
database only when it holds no runs, or with `force`, and never while another connection
uses it."""

from __future__ import annotations

import os
import shutil
import sqlite3
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import URL, Connection, Engine, func, inspect, select, table, text
from sqlalchemy.exc import SQLAlchemyError
from tqdm import tqdm

from jobs.store.database import BUSY_TIMEOUT_MS, database_url, describe, make_engine
from jobs.store.errors import SchemaNewerError, SchemaOutdatedError, StoreError
from jobs.store.migrate import VERSION_TABLE, require_current_schema

SQLITE_HEADER = b"SQLite format 3\x00"
PG_DUMP_HEADER = b"PGDMP"
PAGES_PER_STEP = 256
"""Pages copied between two updates of the progress bar (1 MiB of SQLite's 4 KiB pages)."""
POLL_S = 0.5
RESTORE_HINT = "stop `eslab serve`, its runs and the dashboard first"


def backup_database(file: Path, *, url: str | None = None, force: bool = False) -> int:
    """Copy the database at `url` (else the configured one) to `file`, refusing to replace
    an existing `file` unless `force`; return the size of the copy in bytes."""
    url = url or database_url()
    engine = make_engine(url)
    try:
        _check_destination(file, engine, force)
        if engine.url.get_backend_name() == "sqlite":
            _sqlite_backup(_sqlite_path(engine), file)
        else:
            _pg_backup(engine.url, file)
    finally:
        engine.dispose()
    return file.stat().st_size


def restore_database(file: Path, *, url: str | None = None, force: bool = False) -> str | None:
    """Bring the backup `file` back into the database at `url` (else the configured one),
    refusing one that holds runs unless `force`. Return None when the restored database is
    at this code's migration, else what to do (a backup of an older ES Lab: `eslab db
    upgrade`)."""
    url = url or database_url()
    engine = make_engine(url)
    try:
        if engine.url.get_backend_name() == "sqlite":
            _sqlite_restore(file, engine, force)
        else:
            _pg_restore(file, engine, force)
    finally:
        engine.dispose()
    return _schema_problem(url)


# -- what both databases share ---------------------------------------------------------------


def _check_destination(file: Path, engine: Engine, force: bool) -> None:
    if file.is_dir():
        raise StoreError(f"backup file {file} is a folder; name a file in it")
    if not file.parent.is_dir():
        raise StoreError(f"backup file {file}: the folder {file.parent} is missing")
    if not file.exists():
        return
    if engine.url.get_backend_name() == "sqlite" and file.resolve() == _sqlite_path(engine):
        raise StoreError(f"backup file {file} is the database itself; name another file")
    if not force:
        raise StoreError(f"backup file {file} exists; pass --force to replace it")


def _check_backup_file(file: Path, header: bytes, engine: Engine) -> None:
    """`file` is readable and starts with the `header` of the configured database's kind."""
    try:
        with file.open("rb") as handle:
            start = handle.read(len(SQLITE_HEADER))
    except OSError as exc:
        raise StoreError(f"backup file {file}: cannot read it ({exc.strerror})") from exc
    if start.startswith(header):
        return
    kinds = {SQLITE_HEADER: "an SQLite database", PG_DUMP_HEADER: "a pg_dump archive"}
    other = next((kind for magic, kind in kinds.items() if start.startswith(magic)), None)
    if other is None:
        raise StoreError(
            f"backup file {file} is not a backup of `eslab db backup` (neither an SQLite "
            "database nor a pg_dump archive)"
        )
    raise StoreError(
        f"backup file {file} is {other}, which does not restore into the database "
        f"{describe(str(engine.url))}; set ESLAB_DATABASE_URL to a database of its kind"
    )


def _refuse_replacing_runs(engine: Engine, force: bool) -> None:
    if force:
        return
    with _reading(engine) as connection:
        has_runs = inspect(connection).has_table("runs")
        runs = connection.scalar(select(func.count()).select_from(table("runs"))) if has_runs else 0
    if runs:
        raise StoreError(
            f"the database {describe(str(engine.url))} holds {runs} run(s), which the restore "
            "would replace; pass --force to replace them (`eslab db backup` them first), or "
            "point ESLAB_DATABASE_URL at a new database"
        )


@contextmanager
def _reading(engine: Engine) -> Iterator[Connection]:
    """A connection for a check before a restore, closed with the engine's pool after it:
    no connection of ours may hold the database while it is replaced."""
    try:
        with engine.connect() as connection:
            yield connection
    except SQLAlchemyError as exc:
        reason = getattr(exc, "orig", None) or exc
        raise StoreError(f"cannot read the database {describe(str(engine.url))}: {reason}") from exc
    finally:
        engine.dispose()


def _schema_problem(url: str) -> str | None:
    engine = make_engine(url)
    try:
        require_current_schema(engine)
    except (SchemaOutdatedError, SchemaNewerError) as exc:
        return str(exc)
    finally:
        engine.dispose()
    return None


@contextmanager
def _written_beside(file: Path) -> Iterator[Path]:
    """A new 0600 file beside `file`, renamed to `file` when the block succeeds and removed
    when it fails, so `file` is the old one or the whole new one, never part of one."""
    fd, name = tempfile.mkstemp(dir=file.parent, prefix=f".{file.name}.", suffix=".part")
    os.close(fd)
    temp = Path(name)
    try:
        yield temp
        with temp.open("rb") as written:
            os.fsync(written.fileno())
        os.replace(temp, file)
    finally:
        temp.unlink(missing_ok=True)


def _progress_bar(description: str, total: int | None = None) -> tqdm:
    return tqdm(total=total, desc=description, unit="B", unit_scale=True, dynamic_ncols=True)


# -- SQLite --------------------------------------------------------------------------------


def _sqlite_path(engine: Engine) -> Path:
    database = engine.url.database
    if not database or database == ":memory:":
        raise StoreError("an in-memory SQLite database has nothing to back up or restore into")
    return Path(database).resolve()


def _sqlite_backup(database: Path, file: Path) -> None:
    if not database.is_file():
        raise StoreError(f"the database {database} does not exist: there is nothing to back up")
    with _sqlite_errors(f"cannot back up the database {database}"):
        source = sqlite3.connect(database, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None)
        try:
            # The read transaction that fixes the snapshot: it begins at the first read.
            source.execute("BEGIN")
            source.execute("SELECT count(*) FROM sqlite_master").fetchone()
            with _written_beside(file) as temp:
                _copy_pages(source, temp, f"backup of {database.name}")
        finally:
            source.close()


def _sqlite_restore(file: Path, engine: Engine, force: bool) -> None:
    _check_backup_file(file, SQLITE_HEADER, engine)
    source = _open_backup(file)
    try:
        database = _sqlite_path(engine)
        if database.exists():
            _refuse_replacing_runs(engine, force)
        with _written_beside(database) as temp:
            with _sqlite_errors(f"cannot restore backup file {file}"):
                _copy_pages(source, temp, f"restore of {file.name}")
            if database.exists():  # who may read it stays as it was
                temp.chmod(stat.S_IMODE(database.stat().st_mode))
            _retire(database)
    finally:
        source.close()


def _copy_pages(source: sqlite3.Connection, temp: Path, description: str) -> None:
    page_size = source.execute("PRAGMA page_size").fetchone()[0]
    target = sqlite3.connect(temp)
    try:
        with _progress_bar(description) as bar:

            def progress(_status: int, remaining: int, total: int) -> None:
                bar.total = total * page_size
                bar.update((total - remaining) * page_size - bar.n)

            source.backup(target, pages=PAGES_PER_STEP, progress=progress)
        # One file that stands alone: no WAL to carry beside it.
        target.execute("PRAGMA journal_mode=DELETE")
    finally:
        target.close()


def _open_backup(file: Path) -> sqlite3.Connection:
    """The backup, read-only, after checking that it is whole and an ES Lab database."""
    source = sqlite3.connect(f"{file.resolve().as_uri()}?mode=ro", uri=True)
    try:
        with _sqlite_errors(f"backup file {file} is damaged"):
            check = source.execute("PRAGMA quick_check").fetchone()[0]
            tables = {row[0] for row in source.execute("SELECT name FROM sqlite_master")}
        if check != "ok":
            raise StoreError(f"backup file {file} is damaged: {check}")
        if not {"runs", VERSION_TABLE} <= tables:
            raise StoreError(
                f"backup file {file} is an SQLite database but not ES Lab's (it has no runs "
                "or alembic_version table)"
            )
    except BaseException:
        source.close()
        raise
    return source


def _retire(database: Path) -> None:
    """Take the old database out of WAL mode, which folds its WAL into it and removes it (a
    WAL left beside the new file would be replayed into it), and which SQLite refuses
    while any other connection has the database open: a restore under a live service is
    refused rather than swapped beneath it."""
    if not database.exists():
        return
    connection = sqlite3.connect(database, timeout=1, isolation_level=None)
    try:
        mode = connection.execute("PRAGMA journal_mode=DELETE").fetchone()[0]
    except sqlite3.OperationalError:  # "database is locked"
        mode = None
    finally:
        connection.close()
    if mode != "delete":
        raise StoreError(f"the database {database} is in use by another program: {RESTORE_HINT}")


@contextmanager
def _sqlite_errors(what: str) -> Iterator[None]:
    try:
        yield
    except sqlite3.Error as exc:
        raise StoreError(f"{what}: {exc}") from exc


# -- PostgreSQL ----------------------------------------------------------------------------


def _pg_backup(url: URL, file: Path) -> None:
    with _written_beside(file) as temp, _libpq(url) as (conninfo, env):
        _run_pg_tool(
            [_pg_program("pg_dump"), "--format=custom", "--no-password", f"--file={temp}"],
            conninfo,
            env,
            what=f"pg_dump of {describe(str(url))}",
            watch=temp,
        )


def _pg_restore(file: Path, engine: Engine, force: bool) -> None:
    _check_backup_file(file, PG_DUMP_HEADER, engine)
    program = _pg_program("pg_restore")
    listing = subprocess.run(
        [program, "--list", str(file)], capture_output=True, text=True, stdin=subprocess.DEVNULL
    )
    if listing.returncode:
        raise StoreError(
            f"backup file {file} is not a whole pg_dump archive: {_one_line(listing.stderr)}"
        )
    _refuse_replacing_runs(engine, force)
    _refuse_in_use_pg(engine)
    with _libpq(engine.url) as (conninfo, env):
        _run_pg_tool(
            [
                program,
                "--clean",
                "--if-exists",
                "--no-owner",
                "--no-privileges",
                "--single-transaction",
                "--exit-on-error",
                "--no-password",
                str(file),
            ],
            conninfo,
            env,
            what=f"restore of backup file {file} into {describe(str(engine.url))}",
        )


def _refuse_in_use_pg(engine: Engine) -> None:
    """pg_restore would wait behind a live service's transactions, then drop its tables.
    Only clients count: the server's own workers (autovacuum visits every database now and
    then, a fresh one too) come and go and hold no transaction pg_restore waits behind."""
    others = text(
        "SELECT count(*) FROM pg_stat_activity "
        "WHERE datname = current_database() AND pid <> pg_backend_pid() "
        "AND backend_type = 'client backend'"
    )
    with _reading(engine) as connection:
        count = connection.scalar(others)
    if count:
        raise StoreError(
            f"the database {describe(str(engine.url))} is in use ({count} other "
            f"connection(s)): {RESTORE_HINT}"
        )


@contextmanager
def _libpq(url: URL) -> Iterator[tuple[str, dict[str, str]]]:
    """The connection string for pg_dump and pg_restore, without the password, and their
    environment, where PGPASSFILE names a 0600 file in a 0700 temporary folder holding it."""
    from psycopg.conninfo import make_conninfo

    query = {
        key: value if isinstance(value, str) else value[-1] for key, value in url.query.items()
    }
    password = query.pop("password", None) or url.password
    fields = {"host": url.host, "port": url.port, "user": url.username, "dbname": url.database}
    conninfo = make_conninfo(**{k: v for k, v in fields.items() if v is not None}, **query)
    env = dict(os.environ)
    with tempfile.TemporaryDirectory(prefix="eslab-pgpass-") as folder:
        if password:
            passfile = Path(folder) / "pgpass"
            escaped = str(password).replace("\\", "\\\\").replace(":", "\\:")
            fd = os.open(passfile, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as handle:
                handle.write(f"*:*:*:*:{escaped}\n")
            env["PGPASSFILE"] = str(passfile)
            env.pop("PGPASSWORD", None)
        yield conninfo, env


def _run_pg_tool(
    command: list[str], conninfo: str, env: dict[str, str], *, what: str, watch: Path | None = None
) -> None:
    """Run the program with `--dbname=conninfo`; while it runs, a bar shows how much of
    `watch` (its output) it has written. Its error becomes one StoreError."""
    with tempfile.TemporaryFile() as errors:
        process = subprocess.Popen(
            [*command, f"--dbname={conninfo}"],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=errors,
        )
        try:
            with _progress_bar(what) as bar:
                while not _ended(process):
                    if watch is not None:
                        bar.update(watch.stat().st_size - bar.n)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
        if process.returncode:
            errors.seek(0)
            message = errors.read().decode(errors="replace")
            raise StoreError(f"{what} failed: {_one_line(message)}")


def _ended(process: subprocess.Popen) -> bool:
    try:
        process.wait(timeout=POLL_S)
    except subprocess.TimeoutExpired:
        return False
    return True


def _pg_program(name: str) -> str:
    """`name` on PATH, else the newest of Debian's /usr/lib/postgresql/VERSION/bin."""
    found = shutil.which(name)
    if found:
        return found
    versions = sorted(
        Path("/usr/lib/postgresql").glob(f"*/bin/{name}"),
        key=lambda path: int(path.parts[-3]) if path.parts[-3].isdigit() else 0,
    )
    if not versions:
        raise StoreError(
            f"{name} is not installed: install PostgreSQL's client programs (Debian: "
            "`apt-get install postgresql-client`), of the server's version or newer"
        )
    return str(versions[-1])


def _one_line(message: str) -> str:
    """A program's messages as one line (libpq's span several: the error, then a hint)."""
    return " ".join(message.split()) or "no message"
