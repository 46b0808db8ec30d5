"""The local Ray head of `eslab serve`: started, adopted from a serve that was killed, watched
and started again when it stops.

The head is `ray start --head --block` in a session of its own, with free ports and a private
temp dir: a second Ray on the machine (a test session, another user's) keeps working, and
plain `ray.init()` elsewhere does not attach to ours (it looks for
/tmp/ray/ray_current_cluster, which a private temp dir leaves alone). It is a single-machine
node, every one of its servers bound to 127.0.0.1, and with token authentication
(engine.backends.ray_auth) each of them refuses a request without this user's token; so does
a RAY_ADDRESS cluster, or ES Lab refuses to use it.

A head that stops while the serve runs (killed, or Ray itself failing) is noticed by the
scheduler's next tick (`Cluster.revive`), which starts a new one: the jobs of the old head
are gone, so their runs fail naming their lost Ray job (`eslab resume` continues them), and
queued runs go to the new head.
"""

from __future__ import annotations

import fcntl
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from engine.backends.ray_auth import (
    LOOPBACK_ONLY_SETTING,
    refuse_open_cluster,
    require_token_mode,
)
from jobs.ray_jobs import RayJobs, RayUnavailableError
from jobs.serve_leftovers import Head, NoteKeeper, head_process, stop_head

RAY_START_TIMEOUT_S = 120.0
RAY_DASHBOARD_PORT = 8265
"""Ray's own default, for a local head: taken when free, else any free port."""


HEAD_START_ATTEMPTS = 2
RAY_NODE_START_TIMED_OUT = "timed out during startup"
"""What `ray start` prints when the head's raylet did not register with its GCS within the
30 s that Ray allows (fixed in ray._private.node). On a machine whose cores are all busy (two
vLLM engines starting beside it on two cores) a head once missed it and exited; such a start
is tried again, up to HEAD_START_ATTEMPTS in all."""


class ServiceError(Exception):
    """Something `eslab serve` needs could not start; the message says what to do."""


class HeadStartTimedOut(ServiceError):
    """Ray gave up on the head's own start (RAY_NODE_START_TIMED_OUT): worth another try."""


class LocalHead:
    """This serve's own head, one at a time: started here or adopted."""

    def __init__(
        self,
        num_cpus: int | None,
        object_store_bytes: int | None,
        token_auth: bool,
        notes: NoteKeeper | None,
    ) -> None:
        self.num_cpus, self.object_store_bytes = num_cpus, object_store_bytes
        self.token_auth, self.notes = token_auth, notes
        self.head: Head | None = None
        self._process: subprocess.Popen | None = None
        self._log: IO[str] | None = None

    @property
    def address(self) -> str:
        assert self.head is not None
        return self.head.address

    def adopt(self, leftover: Head) -> bool:
        """Use the head of a serve that was killed if it still answers (its runs go on);
        stop what is left of it otherwise."""
        if not _adopt(leftover, self.token_auth):
            return False
        self._record(leftover)
        return True

    def start(self) -> str:
        """Start a head and wait until its dashboard answers; its address. A start that Ray
        itself timed out is stopped, every process of it, and made again."""
        for attempt in range(1, HEAD_START_ATTEMPTS):
            try:
                return self._start_once()
            except HeadStartTimedOut:
                self.stop()
                print(
                    f"eslab serve: the Ray head timed out during its start (attempt {attempt} "
                    f"of {HEAD_START_ATTEMPTS}); starting it again",
                    flush=True,
                )
        return self._start_once()

    def _start_once(self) -> str:
        temp_dir = tempfile.mkdtemp(prefix="eslab-ray-")
        self._log = open(os.path.join(temp_dir, "ray-start.log"), "w")  # noqa: SIM115 - in stop
        with _one_head_start_at_a_time():
            dashboard_port = _free_port(preferred=RAY_DASHBOARD_PORT)
            command = _head_command(
                temp_dir, dashboard_port, self.num_cpus, self.object_store_bytes
            )
            self._process = subprocess.Popen(
                command,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # out of reach of the terminal's Ctrl-C
                env={**os.environ, LOOPBACK_ONLY_SETTING: "0"},
            )
            address = f"http://127.0.0.1:{dashboard_port}"
            self._record(Head(self._process.pid, temp_dir, address))
            _wait_until_up(self._process, address, self._log.name)
        if self.token_auth:
            refuse_open_cluster(address)
        print(f"Ray dashboard on {address}", flush=True)
        return address

    def alive(self) -> bool:
        if self._process is not None:
            return self._process.poll() is None
        return self.head is not None and head_process(self.head) is not None

    def stop(self) -> None:
        """Stop the head and its processes (`ray start --block` stops them on SIGTERM)."""
        if self._process is not None:
            terminate(self._process, timeout=60)
        if self.head is not None:
            stop_head(self.head)  # what SIGTERM left, and an adopted head's processes
        if self._log is not None:
            self._log.close()
        self._process, self._log, self.head = None, None, None

    def _record(self, head: Head) -> None:
        self.head = head
        if self.notes is not None:
            self.notes.record(head=head)


@dataclass
class Cluster:
    """The Ray cluster a serve schedules on: RAY_ADDRESS's, or this serve's own head."""

    ray_address: str | None = None  # RAY_ADDRESS, when the cluster is not this serve's
    local: LocalHead | None = None

    @property
    def address(self) -> str:
        """Where Ray's job server answers: the local head's, which `revive` may change."""
        if self.local is not None:
            return self.local.address
        assert self.ray_address is not None
        return self.ray_address

    @property
    def owned(self) -> bool:
        """Whether this serve started (or adopted) the cluster, and stops it."""
        return self.local is not None

    def revive(self) -> str | None:
        """When this serve's own head has stopped: a new one, started now, and its address;
        None while it runs, or for a cluster that is not this serve's."""
        if self.local is None or self.local.alive():
            return None
        print(
            f"eslab serve: the Ray head at {self.address} stopped; starting a new one (the "
            "runs it held fail naming their lost Ray job; `eslab resume` continues them)",
            flush=True,
        )
        self.local.stop()
        return self.local.start()


@contextmanager
def ray_cluster(
    num_cpus: int | None = None,
    object_store_bytes: int | None = None,
    *,
    token_auth: bool = True,
    leftover_head: Head | None = None,
    notes: NoteKeeper | None = None,
) -> Iterator[Cluster]:
    """RAY_ADDRESS's cluster when set, else a local head that this context starts and stops
    (with `num_cpus`, default ESLAB_RAY_NUM_CPUS or all, and an object store of
    `object_store_bytes`, default Ray's). `leftover_head`, the head of a serve that was
    killed (jobs.serve_leftovers), is adopted when it answers; `notes` records the head in
    use for a successor."""
    if token_auth:
        require_token_mode()
    if os.environ.get("RAY_ADDRESS"):
        if token_auth:
            refuse_open_cluster(os.environ["RAY_ADDRESS"])
        yield Cluster(ray_address=os.environ["RAY_ADDRESS"])
        return
    local = LocalHead(num_cpus, object_store_bytes, token_auth, notes)
    try:
        if leftover_head is None or not local.adopt(leftover_head):
            local.start()
        yield Cluster(local=local)
    finally:
        local.stop()


def _adopt(head: Head, token_auth: bool) -> bool:
    """Whether the head of a killed serve still runs and answers, to be used again; one that
    does not is stopped, with every process of it."""
    if head_process(head) is not None:
        try:
            RayJobs(head.address).client  # noqa: B018 - connecting is the test
            if token_auth:
                refuse_open_cluster(head.address)
            print(
                f"eslab serve: the Ray head of an earlier eslab serve that was killed still "
                f"runs (pid {head.pid}, {head.address}): using it, its runs go on",
                flush=True,
            )
            return True
        except Exception:  # unreachable, refusing this user's token, or open: not to be used
            pass
    if stopped := stop_head(head):
        print(
            f"eslab serve: stopped {stopped} process(es) left of the Ray head of an earlier "
            f"eslab serve that was killed (pid {head.pid}); the runs it held fail, and "
            "`eslab resume` continues them from their last checkpoint",
            flush=True,
        )
    return False


def _head_command(
    temp_dir: str, dashboard_port: int, num_cpus: int | None, object_store_bytes: int | None
) -> list[str]:
    command = [
        sys.executable,
        "-m",
        "ray.scripts.scripts",
        "start",
        "--head",
        "--block",
        f"--temp-dir={temp_dir}",
        "--port=0",
        "--dashboard-host=127.0.0.1",
        f"--dashboard-port={dashboard_port}",
        f"--dashboard-agent-listen-port={_free_port()}",
        f"--ray-client-server-port={_free_port()}",
        "--disable-usage-stats",
    ]
    num_cpus = num_cpus or int(os.environ.get("ESLAB_RAY_NUM_CPUS") or 0) or None
    if num_cpus:
        command.append(f"--num-cpus={num_cpus}")
    if object_store_bytes:
        command.append(f"--object-store-memory={object_store_bytes}")
    return command


@contextmanager
def _one_head_start_at_a_time() -> Iterator[None]:
    """Held from choosing the head's ports until its dashboard answers. The ports are free
    when chosen and bound by Ray seconds later: two heads starting at once on one machine (two
    serves, test sessions side by side) both chose RAY_DASHBOARD_PORT, and one of them then
    sent its runs to the other's cluster. This user's head starts take turns; the lock goes
    with the process."""
    path = Path(tempfile.gettempdir()) / f"eslab-ray-start-{os.getuid()}.lock"
    with path.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _wait_until_up(head: subprocess.Popen, address: str, log_path: str) -> None:
    deadline = time.monotonic() + RAY_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if head.poll() is not None:
            tail = Path(log_path).read_text()[-2000:]
            error = HeadStartTimedOut if RAY_NODE_START_TIMED_OUT in tail else ServiceError
            raise error(f"the local Ray head failed to start (exit code {head.returncode}): {tail}")
        try:
            jobs = RayJobs(address)
            jobs.client  # noqa: B018 - connecting is the test
            if jobs.cluster_resources():  # and its node registered: runs can be placed
                return
        except RayUnavailableError:
            pass
        time.sleep(0.5)
    raise ServiceError(
        f"the local Ray head did not answer within {RAY_START_TIMEOUT_S:.0f} "
        f"s; see {log_path}, or set RAY_ADDRESS to an existing Ray cluster"
    )


def _free_port(preferred: int = 0) -> int:
    """`preferred` unless taken (e.g. by another Ray), else any free port."""
    for candidate in dict.fromkeys((preferred, 0)):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", candidate))
            except OSError:
                continue
            return s.getsockname()[1]
    raise ServiceError("no free TCP port on 127.0.0.1 for Ray")


def terminate(process: subprocess.Popen, timeout: float) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
