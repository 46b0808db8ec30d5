"""What `eslab serve` starts: Ray, the scheduler and the Streamlit dashboard; Ctrl-C stops
them in the reverse order.

Ray: with RAY_ADDRESS set, the existing cluster (its runs keep running when ES Lab stops);
otherwise a local head with its dashboard (`ray start --head --block`), in a session of its
own so that a Ctrl-C in the terminal reaches ES Lab only: ES Lab then stops the runs' jobs
(each saves a checkpoint and ends cancelled, ready for `eslab resume`) before the head goes.
The service process itself is not a Ray driver; it talks to Ray over HTTP only.

Only one scheduler runs per database (jobs.scheduler's lock): a second `eslab serve` on the
same database says so and serves the dashboard alone.
"""

from __future__ import annotations

import fcntl
import ipaddress
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from engine.backends.ray_auth import (
    LOOPBACK_ONLY_SETTING,
    RayAuthError,
    refuse_open_cluster,
    require_token_mode,
)
from engine.config.urls import url_problem
from engine.data.uploads import FORM_UPLOAD_MB
from jobs.private_files import read_private, remove_private, write_private
from jobs.ray_jobs import RayJobs, RayUnavailableError, SubmitError
from jobs.scheduler import (
    LOCK_NAME,
    Scheduler,
    SchedulerSettings,
    default_owner,
    lock_holder_message,
    owner_is_gone,
)
from jobs.serve_leftovers import (
    Head,
    NoteKeeper,
    ServeNote,
    head_process,
    read_note,
    serve_alive,
    stop_dashboard,
    stop_head,
)
from jobs.store.status import RunStatus
from jobs.store.store import Store
from jobs.uploads import clean_uploads

RAY_START_TIMEOUT_S = 120.0
RAY_DASHBOARD_PORT = 8265
"""Ray's own default, for a local head: taken when free, else any free port."""
DASHBOARD_FILE = "dashboard-url"
"""In the private folder (jobs.private_files): the address of the serving dashboard."""
DASHBOARD_APP = Path(__file__).resolve().parents[1] / "app" / "server.py"
"""app/main.py served with the dataset upload route beside it (app/upload_route.py)."""
TRUSTED_PROXIES_SETTING = "ESLAB_TRUSTED_PROXIES"


class ServiceError(Exception):
    """Something `eslab serve` needs could not start; the message says what to do."""


def serve(
    host: str, port: int, settings: SchedulerSettings | None = None, *, ray_token: bool = True
) -> int:
    """Run until Ctrl-C, SIGTERM or SIGHUP (or until the dashboard exits); returns the exit
    code. `ray_token` False lets Ray run without token authentication (engine.backends.ray_auth)."""
    _stop_on_termination_signals()
    store = Store()  # refuses an unreachable or outdated database in one line
    settings = settings or SchedulerSettings.from_env()
    if removed := clean_uploads(store):
        print(f"removed {len(removed)} upload(s) that no run uses", flush=True)
    try:
        # The lock first, so that a second `eslab serve` starts no Ray of its own; held
        # long enough for Ray to start, then renewed by every tick.
        owner = default_owner()
        lease = settings.lock_lease_seconds + RAY_START_TIMEOUT_S
        _take_over_a_dead_serves_lock(store)
        if not store.acquire_lock(LOCK_NAME, owner, lease):
            print(
                f"eslab serve: {lock_holder_message(store)}; this one serves the "
                "dashboard without a scheduler",
                flush=True,
            )
            return run_dashboard(host, port)
        notes = NoteKeeper(store.engine.url.render_as_string(hide_password=True), os.getpid())
        leftover = _leftover_of_a_killed_serve(notes.database)
        try:
            with ray_cluster(
                token_auth=ray_token,
                leftover_head=leftover.head if leftover else None,
                notes=notes,
            ) as (address, owned):
                jobs = RayJobs(address)
                scheduler = Scheduler(store, jobs, settings, owner=owner)
                scheduler.start()  # renews the lock taken above
                print(
                    f"scheduler: up to {settings.max_concurrent_runs} run(s) at once on "
                    f"Ray at {address}",
                    flush=True,
                )
                try:
                    return run_dashboard(host, port, notes)
                finally:
                    scheduler.shutdown()
                    if owned:
                        stop_runs_for_shutdown(store, jobs, settings.stop_wait_seconds + 10)
                    else:
                        print(
                            "runs on the Ray cluster keep running; the next `eslab serve` "
                            "follows them again",
                            flush=True,
                        )
        finally:
            notes.forget()
            store.release_lock(LOCK_NAME, owner)
    finally:
        store.close()


def _take_over_a_dead_serves_lock(store: Store) -> None:
    """A serve killed outright keeps the scheduler lock until its lease ends; a successor on
    the same machine takes it over at once instead of serving without a scheduler."""
    holder = store.lock_holder(LOCK_NAME)
    if holder is not None and owner_is_gone(holder.owner):
        store.release_lock(LOCK_NAME, holder.owner)
        print(
            f"eslab serve: took over the scheduler lock of {holder.owner}, a process of this "
            "machine that was stopped without releasing it",
            flush=True,
        )


def _leftover_of_a_killed_serve(database: str) -> ServeNote | None:
    """The note of an earlier serve on this database that was killed without its cleanup,
    with its dashboard, which still holds the port, stopped; None when there is none."""
    note = read_note(database)
    if note is None or serve_alive(note):
        return None
    if stop_dashboard(note, str(DASHBOARD_APP)):
        print(
            f"eslab serve: stopped the dashboard (pid {note.dashboard_pid}) of an earlier "
            f"eslab serve (pid {note.serve_pid}) that was killed",
            flush=True,
        )
    return note


def _stop_on_termination_signals() -> None:
    """SIGTERM (`kill`, a service manager) and SIGHUP (the terminal closed) stop `eslab serve`
    the way Ctrl-C does. Python's default for both ends the process without running `finally`
    blocks, which left the Ray head (in a session of its own), its runs and the scheduler
    lock behind (seen: a Ray head still up after `eslab serve` was terminated)."""

    def interrupt(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, interrupt)


# -- Ray --------------------------------------------------------------------------------


@contextmanager
def ray_cluster(
    num_cpus: int | None = None,
    object_store_bytes: int | None = None,
    *,
    token_auth: bool = True,
    leftover_head: Head | None = None,
    notes: NoteKeeper | None = None,
) -> Iterator[tuple[str, bool]]:
    """(address, owned): RAY_ADDRESS when set, else a local head that this context starts
    and stops (with `num_cpus`, default ESLAB_RAY_NUM_CPUS or all, and an object store of
    `object_store_bytes`, default Ray's).

    The head is `ray start --head --block` in a session of its own, with free ports and a
    private temp dir: a second Ray on the machine (a test session, another user's) keeps
    working, and plain `ray.init()` elsewhere does not attach to ours (it looks for
    /tmp/ray/ray_current_cluster, which a private temp dir leaves alone). It is a
    single-machine node, every one of its servers bound to 127.0.0.1, and with `token_auth`
    (engine.backends.ray_auth) each of them refuses a request without this user's token; so does a
    RAY_ADDRESS cluster, or ES Lab refuses to use it.

    `leftover_head`, the head of a serve that was killed (jobs.serve_leftovers), is adopted
    when it answers, so its runs go on, and stopped otherwise; `notes` records the head in
    use for a successor."""
    if token_auth:
        require_token_mode()
    if os.environ.get("RAY_ADDRESS"):
        if token_auth:
            refuse_open_cluster(os.environ["RAY_ADDRESS"])
        yield os.environ["RAY_ADDRESS"], False
        return
    if leftover_head is not None and _adopt(leftover_head, token_auth):
        if notes is not None:
            notes.record(head=leftover_head)
        try:
            yield leftover_head.address, True
        finally:
            stop_head(leftover_head)
        return
    temp_dir = tempfile.mkdtemp(prefix="eslab-ray-")
    log = open(os.path.join(temp_dir, "ray-start.log"), "w")  # noqa: SIM115 - closed below
    head = None
    try:
        with _one_head_start_at_a_time():
            dashboard_port = _free_port(preferred=RAY_DASHBOARD_PORT)
            command = _head_command(temp_dir, dashboard_port, num_cpus, object_store_bytes)
            head = subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # out of reach of the terminal's Ctrl-C
                env={**os.environ, LOOPBACK_ONLY_SETTING: "0"},
            )
            address = f"http://127.0.0.1:{dashboard_port}"
            if notes is not None:
                notes.record(head=Head(head.pid, temp_dir, address))
            _wait_until_up(head, address, log.name)
        if token_auth:
            refuse_open_cluster(address)
        print(f"Ray dashboard on {address}", flush=True)
        yield address, True
    finally:
        if head is not None:
            _terminate(head, timeout=60)  # `ray start --block` stops its processes on SIGTERM
        log.close()
        shutil.rmtree(temp_dir, ignore_errors=True)


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
        except (RayUnavailableError, RayAuthError):
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
            raise ServiceError(
                f"the local Ray head failed to start (exit code {head.returncode}): {tail}"
            )
        try:
            RayJobs(address).client  # noqa: B018 - connecting is the test
            return
        except RayUnavailableError:
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


def stop_runs_for_shutdown(store: Store, jobs: RayJobs, wait_seconds: float) -> None:
    """Before the local head goes: stop every run's job so it can save a checkpoint and
    end cancelled; put runs whose worker had not started back in the queue."""
    active = [r for r in store.active_runs() if r.ray_submission_id]
    if not active:
        return
    print(f"stopping {len(active)} run(s); `eslab resume RUN` continues them later", flush=True)
    for run in active:
        if run.status is RunStatus.RUNNING:
            store.request_cancel(run.id)
        try:
            jobs.stop(run.ray_submission_id)
        except RayUnavailableError:
            break
    deadline = time.monotonic() + wait_seconds
    pending = {r.id: r for r in active}
    while pending and time.monotonic() < deadline:
        for run_id in list(pending):
            if store.get_run(run_id).status.is_terminal():
                pending.pop(run_id)
        time.sleep(0.5)
    for run in pending.values():
        current = store.get_run(run.id)
        if current.status is RunStatus.QUEUED:
            store.clear_submission(run.id)
        else:
            store.finish_run(run.id, RunStatus.CANCELLED)
            store.add_event(run.id, "warning", "eslab serve stopped before the worker did")


# -- the dashboard ----------------------------------------------------------------------


def dashboard_command(host: str, port: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(DASHBOARD_APP),
        "--server.address",
        host,
        "--server.port",
        str(port),
        "--server.headless",
        "true",
        "--browser.gatherUsageStats",
        "false",
        # Streamlit takes a copy outside site-packages (pip install --target) for its own
        # development checkout, where --server.port is refused
        "--global.developmentMode",
        "false",
        # the toolbar without Streamlit's developer items ("Deploy", "Rerun", settings)
        "--client.toolbarMode",
        "viewer",
        # An uncaught error shows a generic message in the browser; its type, message and
        # traceback (paths, settings, SQL) go to this process's log only. ("false" would
        # still show the traceback: Streamlit reads it as "stacktrace".)
        "--client.showErrorDetails",
        "none",
        # Streamlit holds every upload in memory: its own cap (checked before the body is
        # read) is YAML-sized; datasets of any size go through app/upload_route.py.
        "--server.maxUploadSize",
        str(FORM_UPLOAD_MB),
    ]


def dashboard_env() -> dict[str, str]:
    """This environment, with the proxies whose X-Forwarded-For the dashboard believes set
    to ESLAB_TRUSTED_PROXIES (FORWARDED_ALLOW_IPS, read by uvicorn, which serves Streamlit).
    uvicorn's own default believes 127.0.0.1 and ::1: on a shared machine any account could
    then send logins from "any address" and slip past the per-client throttle."""
    return {**os.environ, "FORWARDED_ALLOW_IPS": ",".join(trusted_proxies())}


def trusted_proxies() -> list[str]:
    """ESLAB_TRUSTED_PROXIES: the addresses or networks (10.0.0.5, 10.0.0.0/24, ::1) of the
    reverse proxies in front of the dashboard, separated by commas; none when unset. A bad
    entry raises ValueError naming it (uvicorn would take it as a name and trust nothing)."""
    entries = [e.strip() for e in os.environ.get(TRUSTED_PROXIES_SETTING, "").split(",")]
    for entry in filter(None, entries):
        try:
            ipaddress.ip_network(entry, strict=False)
        except ValueError:
            raise ValueError(
                f"{TRUSTED_PROXIES_SETTING} entry {entry!r} is not an IP address or network "
                "(e.g. 127.0.0.1 or 10.0.0.0/24)"
            ) from None
    return [e for e in entries if e]


def run_dashboard(host: str, port: int, notes: NoteKeeper | None = None) -> int:
    """Streamlit in the foreground until it exits or Ctrl-C; its address recorded meanwhile
    for `eslab submit`, and its process in `notes`."""
    print(f"ES Lab dashboard on http://{host}:{port} (Ctrl-C stops it)", flush=True)
    with recorded_dashboard(dashboard_address(host, port)):
        dashboard = subprocess.Popen(dashboard_command(host, port), env=dashboard_env())
        if notes is not None:
            notes.record(dashboard_pid=dashboard.pid)
        try:
            return dashboard.wait()
        except KeyboardInterrupt:
            return 0
        finally:
            _terminate(dashboard, timeout=10)


def dashboard_address(host: str, port: int) -> str:
    """Where this machine opens a dashboard bound to `host`: a wildcard bind (0.0.0.0, ::)
    at the loopback address."""
    shown = "127.0.0.1" if host in ("", "0.0.0.0", "::") else host
    return f"http://[{shown}]:{port}" if ":" in shown else f"http://{shown}:{port}"


def serving_dashboard() -> str | None:
    """The address of the dashboard `eslab serve` runs on this data folder, None when none
    is recorded (or the record is not a URL)."""
    url = (read_private(DASHBOARD_FILE) or "").strip()
    return url if url and url_problem(url) is None else None


@contextmanager
def recorded_dashboard(url: str) -> Iterator[None]:
    """`url` recorded as the serving dashboard while the block runs. When it ends, the
    address it replaced comes back (a second `eslab serve` stopped while the first goes
    on), unless a later one recorded its own since. A record that cannot be written is
    said and skipped: the dashboard serves all the same."""
    previous = serving_dashboard()
    try:
        write_private(DASHBOARD_FILE, url)
    except (OSError, SubmitError) as exc:
        print(f"eslab serve: `eslab submit` cannot learn this address: {exc}", flush=True)
        yield
        return
    try:
        yield
    finally:
        if serving_dashboard() == url:
            if previous and previous != url:
                write_private(DASHBOARD_FILE, previous)
            else:
                remove_private(DASHBOARD_FILE)


def _terminate(process: subprocess.Popen, timeout: float) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
