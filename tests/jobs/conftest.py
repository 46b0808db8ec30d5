"""Databases, the `eslab` command's database and run file (`db`, `config_file`) and Ray for
the jobs tests.

`db_url` / `store` run every store test twice: on a SQLite file and on PostgreSQL, started
here from Debian's `postgresql` package on 127.0.0.1 (one server per session, one fresh
database per test). Where PostgreSQL is not installed those variants are skipped with the
reason. `ray_address` is one local Ray head per test file (2 CPUs, small object store), shut
down when the file is done.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from urllib.parse import quote

import pytest
import yaml

from engine.data.datasets import Example, write_dataset
from jobs.store.migrate import upgrade
from jobs.store.store import Store
from tests.model_folders import DEFAULT_MODEL, placeholder_model
from tests.outputs import allow_temporary_outputs  # noqa: F401 (an autouse fixture)

PG_USER = "eslab"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- SQLite --------------------------------------------------------------------------------


@pytest.fixture
def sqlite_url(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'eslab.db'}"


@pytest.fixture
def sqlite_store(sqlite_url) -> Iterator[Store]:
    upgrade(sqlite_url)
    store = Store(sqlite_url)
    yield store
    store.close()


# -- PostgreSQL ----------------------------------------------------------------------------


def _pg_bin(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return candidates[-1] if candidates else None


class PostgresServer:
    """A throw-away PostgreSQL cluster in a temporary folder. PostgreSQL refuses to run as
    root, so as root the server runs as the `postgres` user the package creates. With a
    `password`, every connection must give it (scram-sha-256); without, none is asked."""

    def __init__(self, password: str | None = None) -> None:
        initdb, self.pg_ctl = _pg_bin("initdb"), _pg_bin("pg_ctl")
        if not (initdb and self.pg_ctl):
            raise RuntimeError(
                "PostgreSQL is not installed (no initdb/pg_ctl): `apt-get install -y postgresql`"
            )
        self.folder = tempfile.mkdtemp(prefix="eslab-pg-")
        self.data = os.path.join(self.folder, "data")
        self.port = free_port()
        self._as = []
        if os.geteuid() == 0:
            shutil.chown(self.folder, "postgres")
            self._as = ["runuser", "-u", "postgres", "--"]
        auth = ["--auth=trust"]
        if password:
            pwfile = os.path.join(self.folder, "pwfile")
            with open(pwfile, "w") as handle:
                handle.write(password)
            if self._as:
                shutil.chown(pwfile, "postgres")
            auth = ["--auth=scram-sha-256", f"--pwfile={pwfile}"]
        self._run(initdb, "-D", self.data, "-U", PG_USER, *auth, "-E", "UTF8", "--no-sync")
        self._start()
        self.password = password
        user = PG_USER if password is None else f"{PG_USER}:{quote(password, safe='')}"
        self.base_url = f"postgresql+psycopg://{user}@127.0.0.1:{self.port}"

    def _start(self) -> None:
        options = (
            f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1 "
            "-c fsync=off -c synchronous_commit=off -c full_page_writes=off"
        )
        self._run(
            self.pg_ctl,
            "-D",
            self.data,
            "-o",
            options,
            "-l",
            os.path.join(self.folder, "log"),
            "-w",
            "-t",
            "60",
            "start",
        )

    def shut_down(self) -> None:
        """Stop the server, ending every connection, and keep its data (start_again)."""
        self._run(self.pg_ctl, "-D", self.data, "-m", "fast", "-w", "stop")

    def start_again(self) -> None:
        self._start()

    def _run(self, *cmd: str) -> None:
        result = subprocess.run([*self._as, *cmd], capture_output=True, text=True, timeout=120)
        if result.returncode:
            raise RuntimeError(f"{' '.join(cmd[:1])} failed: {result.stderr or result.stdout}")

    def create_database(self) -> str:
        import psycopg

        name = f"t_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(
            host="127.0.0.1",
            port=self.port,
            user=PG_USER,
            password=self.password,
            dbname="postgres",
            autocommit=True,
        ) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return f"{self.base_url}/{name}"

    def stop(self) -> None:
        subprocess.run(
            [*self._as, self.pg_ctl, "-D", self.data, "-m", "immediate", "stop"],
            capture_output=True,
            timeout=60,
        )
        shutil.rmtree(self.folder, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer | str]:
    """The server, or the reason it could not start (each PostgreSQL test skips with it)."""
    try:
        server = PostgresServer()
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        print(f"\nPostgreSQL variants skipped: {exc}")
        yield str(exc)
        return
    yield server
    server.stop()


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request, tmp_path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'eslab.db'}"
    server = request.getfixturevalue("postgres")
    if isinstance(server, str):
        pytest.skip(f"PostgreSQL unavailable: {server}")
    return server.create_database()


@pytest.fixture
def store(db_url) -> Iterator[Store]:
    upgrade(db_url)
    store = Store(db_url)
    yield store
    store.close()


# -- the eslab command ---------------------------------------------------------------------


@pytest.fixture
def db(sqlite_store, sqlite_url, monkeypatch, tmp_path):
    monkeypatch.setenv("ESLAB_DATABASE_URL", sqlite_url)
    monkeypatch.delenv("ESLAB_DASHBOARD_URL", raising=False)
    # a data folder of its own: no `eslab serve` of this machine records its address there;
    # the default model's folder in it, as queueing checks it (no run here loads it)
    monkeypatch.setenv("ESLAB_DATA_DIR", str(tmp_path / "data"))
    placeholder_model(tmp_path / "data" / "models" / DEFAULT_MODEL)
    return sqlite_store


@pytest.fixture
def config_file(tmp_path):
    train = write_dataset(
        [
            Example(
                prompt=[{"role": "user", "content": f"say {i}"}], reward_func_args={"target": "ok"}
            )
            for i in range(8)
        ],
        tmp_path / "train.parquet",
    )
    path = tmp_path / "run.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "method": "es",
                "train_file": str(train),
                "output_dir": str(tmp_path / "out"),
                "reward_func_path": "engine.rewards.conciseness.compute_score",
                "data_batch_size": 4,
                "num_train_epochs": 2,
                "population_size": 4,
            }
        )
    )
    return path


# -- Ray -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ray_address() -> Iterator[str]:
    """The dashboard URL of one local Ray head for the test file (2 CPUs, 200 MB object
    store), started the way `eslab serve` starts its own: free ports and a private temp
    dir, so another Ray on the machine (another test session) cannot get in its way. Jobs
    get no working_dir: the worker imports the installed project (tests/ via PYTHONPATH).

    A file's head, not the session's: an idle head (its dashboard, agent, raylet, GCS) takes
    about 8% of a core, which a session-long head would take from the files after it."""
    from jobs.ray_head import ray_cluster

    os.environ.pop("RAY_ADDRESS", None)
    with ray_cluster(num_cpus=2, object_store_bytes=200 * 1024 * 1024) as cluster:
        yield cluster.address
