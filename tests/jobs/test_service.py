"""`eslab serve` as a user runs it: Ray head, scheduler and dashboard come up; a second
serve on the same database runs without a scheduler; Ctrl-C stops everything, the running
run included (it ends cancelled with a checkpoint, ready for `eslab resume`), and so does
SIGTERM to serve alone."""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest

from engine.hosts import is_loopback
from engine.paths import PROJECT_ROOT
from jobs.store.status import RunStatus
from tests.jobs.conftest import free_port
from tests.jobs.helpers import STANDIN, queue_run, wait_for

pytestmark = pytest.mark.heavy

ESLAB = str(Path(sys.executable).with_name("eslab"))
RUN_STEPS_S = 400
"""How long a real run started by serve (a Ray job, its engine, two steps) may take: on a
2-core machine whose other test worker runs an engine too, 180 s was once not enough."""


class Serve:
    """`eslab serve` in a session of its own, so the test can Ctrl-C it like a terminal
    does: SIGINT to its whole process group."""

    def __init__(self, sqlite_url: str, home: Path | None = None, port: int | None = None) -> None:
        self.port = port or free_port()
        env = {
            **os.environ,
            **({"HOME": str(home)} if home else {}),
            "ESLAB_DATABASE_URL": sqlite_url,
            "PYTHONPATH": str(PROJECT_ROOT),
            "ESLAB_WORKER_TRAIN": f"{STANDIN}:train",
            "ESLAB_STANDIN_STEP_S": "0.3",
            "ESLAB_SCHEDULER_TICK_S": "0.5",
            "ESLAB_HEARTBEAT_S": "0.5",
            "ESLAB_STOP_WAIT_S": "10",
        }
        env.pop("RAY_ADDRESS", None)
        self.process = subprocess.Popen(
            [ESLAB, "serve", "--port", str(self.port)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))

    def said(self, text: str) -> bool:
        return any(text in line for line in self.lines)

    def dashboard_answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def ctrl_c(self, timeout: float) -> int:
        os.killpg(self.process.pid, signal.SIGINT)
        return self.process.wait(timeout)

    def terminate(self, timeout: float) -> int:
        """SIGTERM to `eslab serve` alone, as `kill PID` or a service manager sends it."""
        self.process.terminate()
        return self.process.wait(timeout)

    def kill(self) -> None:
        """SIGKILL to the serve's whole group, its dashboard included (which outlives a
        serve killed alone)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()


def test_serve_schedules_refuses_a_second_scheduler_and_stops_cleanly(
    sqlite_store, sqlite_url, tmp_path, monkeypatch
):
    """From an empty HOME, as a fresh service account starts it: Ray gets a token of this
    user's, refuses requests without it, listens on loopback only, and runs the run's job."""
    run = queue_run(sqlite_store, tmp_path / "out", max_steps=500, save_steps=1000)
    home = tmp_path / "home"
    home.mkdir()
    for name in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(name, raising=False)  # set by the session's heads; not by an account
    first = Serve(sqlite_url, home=home)
    second = None
    try:
        wait_for(first.dashboard_answers, 90, "the dashboard")
        assert first.said("scheduler: up to 1 run(s) at once on Ray at http://127.0.0.1:")
        ray_url = next(line.split()[-1] for line in first.lines if "Ray dashboard on" in line)
        token = home / ".ray" / "auth_token"
        assert first.said(f"made a Ray token for this user in {token}")
        assert stat.S_IMODE(token.stat().st_mode) == 0o600
        assert_ray_asks_for_the_token(ray_url, token.read_text())
        wait_for(
            lambda: sqlite_store.get_run(run.id).step >= 2, RUN_STEPS_S, "the run to make steps"
        )
        assert_listens_on_loopback_only(first.process.pid)

        second = Serve(sqlite_url, home=home)
        wait_for(second.dashboard_answers, 60, "the second dashboard")
        assert second.said("this one serves the dashboard without a scheduler")
        assert not second.said("Ray dashboard on")  # it started no Ray of its own
        assert second.ctrl_c(timeout=30) == 0

        assert first.ctrl_c(timeout=60) == 0, "\n".join(first.lines)
        assert first.said("stopping 1 run(s)")
        stopped = sqlite_store.get_run(run.id)
        assert stopped.status is RunStatus.CANCELLED
        assert [c.step for c in sqlite_store.checkpoints(run.id)] == [stopped.step]
        assert sqlite_store.lock_holder("scheduler") is None  # released for the next serve
        with pytest.raises(OSError):
            urllib.request.urlopen(ray_url, timeout=2)  # the local Ray head is gone
    finally:
        first.kill()
        if second is not None:
            second.kill()


def test_a_serve_killed_outright_leaves_its_successor_its_head_port_and_lock(
    sqlite_store, sqlite_url, tmp_path
):
    """SIGKILL runs no cleanup: the head (with the run's job), the dashboard on its port and
    the scheduler lock outlive the serve. The next serve on the database takes the lock at
    once, stops the old dashboard to serve on the same port, and adopts the head: the run
    goes on and succeeds with every step recorded once. Then nothing of either is left."""
    from engine import metrics as mk
    from jobs.serve_leftovers import head_processes, read_note, stop_head

    run = queue_run(sqlite_store, tmp_path / "out", max_steps=40, save_steps=1000)
    database = sqlite_store.engine.url.render_as_string(hide_password=True)
    first = Serve(sqlite_url)
    second = None
    note = None
    try:
        wait_for(first.dashboard_answers, 90, "the dashboard")
        wait_for(
            lambda: sqlite_store.get_run(run.id).step >= 2, RUN_STEPS_S, "the run to make steps"
        )
        note = read_note(database)
        assert note is not None and note.head is not None and note.dashboard_pid is not None
        first.process.kill()  # SIGKILL to serve alone, as the OOM killer sends it
        first.process.wait(10)
        assert psutil.pid_exists(note.head.pid) and psutil.pid_exists(note.dashboard_pid)
        assert sqlite_store.lock_holder("scheduler") is not None

        second = Serve(sqlite_url, port=first.port)
        wait_for(lambda: second.said("ES Lab dashboard on"), 90, "the second serve")
        wait_for(second.dashboard_answers, 60, "the second dashboard")  # the old one is gone
        assert second.said("took over the scheduler lock of"), "\n".join(second.lines)
        assert second.said(f"stopped the dashboard (pid {note.dashboard_pid})")
        assert second.said(f"still runs (pid {note.head.pid}, {note.head.address}): using it")
        assert not second.said("Ray dashboard on")  # no second head beside the first
        done = wait_for(
            lambda: (r := sqlite_store.get_run(run.id)).status.is_terminal() and r,
            120,
            "the run to end",
        )
        assert done.status is RunStatus.SUCCEEDED, done.error
        steps = [p.step for p in sqlite_store.metric_series(run.id, mk.NOISE_STD)]
        assert steps == list(range(1, 41))
        assert second.ctrl_c(timeout=60) == 0, "\n".join(second.lines)
        assert not head_processes(note.head.temp_dir)
        assert read_note(database) is None
    finally:
        first.kill()
        if second is not None:
            second.kill()
        if note is not None and note.head is not None:
            stop_head(note.head)


def test_a_ray_head_that_dies_under_serve_is_replaced_and_its_run_fails_naming_ray(
    sqlite_store, sqlite_url, tmp_path
):
    """Every process of the head killed (as the OOM killer might): the scheduler's next tick
    starts a new head, the run that trained on the old one fails naming its lost Ray job,
    and a run queued meanwhile runs on the new head. Then SIGTERM to serve alone (`kill PID`,
    as a service manager stops it) stops it like Ctrl-C: its head (in a session of its own,
    which no signal to serve's group reaches) and the scheduler lock are not left behind.
    Stopped here, by a serve that was already started, rather than by one of its own: a serve
    and Ray head start is 25 s of the suite."""
    from jobs.serve_leftovers import head_processes, read_note, stop_head

    first = queue_run(sqlite_store, tmp_path / "a", name="a", max_steps=500, save_steps=1000)
    database = sqlite_store.engine.url.render_as_string(hide_password=True)
    serve = Serve(sqlite_url)
    heads = []
    try:
        wait_for(serve.dashboard_answers, 90, "the dashboard")
        wait_for(
            lambda: sqlite_store.get_run(first.id).step >= 2, RUN_STEPS_S, "the run to make steps"
        )
        old = read_note(database).head
        heads.append(old)
        for process in head_processes(old.temp_dir):
            process.kill()
        later = queue_run(sqlite_store, tmp_path / "b", name="b", max_steps=3)
        failed = wait_for(
            lambda: (r := sqlite_store.get_run(first.id)).status.is_terminal() and r,
            120,
            "the first run to end",
        )
        assert failed.status is RunStatus.FAILED
        assert "unknown to Ray" in failed.error, failed.error
        assert serve.said(f"the Ray head at {old.address} stopped; starting a new one")
        heads.append(read_note(database).head)
        assert heads[1].temp_dir != old.temp_dir and not head_processes(old.temp_dir)
        done = wait_for(
            lambda: (r := sqlite_store.get_run(later.id)).status.is_terminal() and r,
            120,
            "the run queued meanwhile to end",
        )
        assert done.status is RunStatus.SUCCEEDED, done.error
        assert serve.terminate(timeout=60) == 0, "\n".join(serve.lines)
        assert sqlite_store.lock_holder("scheduler") is None
        assert not head_processes(heads[1].temp_dir)
        with pytest.raises(OSError):
            urllib.request.urlopen(heads[1].address, timeout=2)  # the new head is gone
    finally:
        serve.kill()
        for head in heads:
            stop_head(head)


def assert_ray_asks_for_the_token(ray_url: str, token: str) -> None:
    jobs = f"{ray_url}/api/jobs/"
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(jobs, timeout=10)
    assert refused.value.code == 401
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(_with_token(jobs, "not-the-token"), timeout=10)
    assert refused.value.code in (401, 403)
    with urllib.request.urlopen(_with_token(jobs, token), timeout=10) as answer:
        assert answer.status == 200


def _with_token(url: str, token: str) -> urllib.request.Request:
    return urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})


def assert_listens_on_loopback_only(pid: int) -> None:
    """Every port that serve's processes listen on (Ray's GCS, raylet, agents, client server,
    the run's job and the dashboard) is bound to a loopback address."""
    serve = psutil.Process(pid)
    listening = [
        (process.name(), conn.laddr)
        for process in [serve, *serve.children(recursive=True)]
        for conn in _connections(process)
        if conn.status == psutil.CONN_LISTEN
    ]
    assert len(listening) >= 5, listening  # Ray's servers were found
    exposed = [(name, addr) for name, addr in listening if not is_loopback(addr.ip)]
    assert not exposed, exposed


def _connections(process: psutil.Process) -> list:
    try:
        return process.net_connections(kind="inet")
    except psutil.NoSuchProcess:
        return []


def test_two_local_heads_started_at_once_each_answer_with_their_own_cluster(monkeypatch):
    """Two serves (or test sessions) starting a local Ray head at the same moment: both would
    take the free preferred dashboard port, and the second then talked to the first's
    cluster. Each must come up at an address of its own, with its own CPUs."""
    from jobs import ray_head
    from jobs.ray_jobs import RayJobs

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(ray_head, "RAY_DASHBOARD_PORT", free_port())  # free for both to choose
    both_started, both_read = threading.Barrier(2, timeout=150), threading.Barrier(2, timeout=150)
    seen: dict[int, tuple[str, float]] = {}
    failures: list[BaseException] = []

    def head(cpus: int) -> None:
        try:
            both_started.wait()
            with ray_head.ray_cluster(num_cpus=cpus, object_store_bytes=100 << 20) as cluster:
                url = cluster.address
                resources = RayJobs(url).cluster_resources  # the node registers after the dashboard
                seen[cpus] = (url, wait_for(lambda: resources().get("CPU"), 60, "the head's CPUs"))
                both_read.wait()  # neither stops before the other has read its cluster
        except BaseException as exc:  # reported by the test below
            failures.append(exc)
            both_read.abort()

    threads = [threading.Thread(target=head, args=(cpus,)) for cpus in (1, 2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures, failures
    assert seen[1][0] != seen[2][0]
    assert (seen[1][1], seen[2][1]) == (1.0, 2.0)


def _ray_start_that(prints: str) -> list[str]:
    """A stand-in for `ray start` that prints `prints` and exits 1, as a failed start does."""
    return [sys.executable, "-c", f"print({prints!r}); raise SystemExit(1)"]


def test_a_head_start_that_ray_timed_out_is_made_again_and_answers(monkeypatch, capsys):
    """`ray start` gives its raylet 30 s to register (fixed in Ray) and exits when a machine
    whose cores are busy takes longer, as two engines starting beside it once did: the head is
    started again, and that one answers."""
    from jobs import ray_head
    from jobs.ray_jobs import RayJobs

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    real_command, commands = ray_head._head_command, []

    def first_one_times_out(*args):
        commands.append(args)
        if len(commands) == 1:
            return _ray_start_that(f"The current node {ray_head.RAY_NODE_START_TIMED_OUT}.")
        return real_command(*args)

    monkeypatch.setattr(ray_head, "_head_command", first_one_times_out)
    with ray_head.ray_cluster(num_cpus=1, object_store_bytes=100 << 20) as cluster:
        assert RayJobs(cluster.address).cluster_resources().get("CPU") == 1.0
    assert len(commands) == 2
    assert commands[0][0] != commands[1][0]  # each start has a temp dir of its own
    assert "timed out during its start (attempt 1 of 2)" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("prints", "starts", "error"),
    [
        ("The current node timed out during startup.", 2, "HeadStartTimedOut"),
        ("some other failure", 1, "ServiceError"),
    ],
)
def test_a_head_start_is_made_again_only_when_ray_timed_it_out(monkeypatch, prints, starts, error):
    from jobs import ray_head

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    commands = []

    def failing(*args):
        commands.append(args)
        return _ray_start_that(prints)

    monkeypatch.setattr(ray_head, "_head_command", failing)
    head = ray_head.LocalHead(1, None, token_auth=False, notes=None)
    try:
        with pytest.raises(ray_head.ServiceError, match=prints) as raised:
            head.start()
    finally:
        head.stop()
    assert type(raised.value).__name__ == error
    assert len(commands) == starts
