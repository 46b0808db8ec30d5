"""What `eslab serve` starts: Ray, the scheduler and the Streamlit dashboard; Ctrl-C stops
them in the reverse order.

Ray: with RAY_ADDRESS set, the existing cluster (its runs keep running when ES Lab stops);
otherwise a local head with its dashboard (jobs.ray_head), in a session of its own so that a
Ctrl-C in the terminal reaches ES Lab only: ES Lab then stops the runs' jobs (each saves a
checkpoint and ends cancelled, ready for `eslab resume`) before the head goes.
The service process itself is not a Ray driver; it talks to Ray over HTTP only.

Only one scheduler runs per database (jobs.scheduler's lock): a second `eslab serve` on the
same database says so and serves the dashboard alone.
"""

from __future__ import annotations

import ipaddress
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from engine.config.urls import url_problem
from engine.data.uploads import FORM_UPLOAD_MB
from jobs.private_files import read_private, remove_private, write_private
from jobs.ray_head import RAY_START_TIMEOUT_S, ray_cluster, terminate
from jobs.ray_jobs import RayJobs, RayUnavailableError, SubmitError
from jobs.scheduler import (
    LOCK_NAME,
    Scheduler,
    SchedulerSettings,
    default_owner,
    lock_holder_message,
    owner_is_gone,
)
from jobs.serve_leftovers import NoteKeeper, ServeNote, read_note, serve_alive, stop_dashboard
from jobs.store.status import RunStatus
from jobs.store.store import Store
from jobs.uploads import clean_uploads

DASHBOARD_FILE = "dashboard-url"
"""In the private folder (jobs.private_files): the address of the serving dashboard."""
DASHBOARD_APP = Path(__file__).resolve().parents[1] / "app" / "server.py"
"""app/main.py served with the dataset upload route beside it (app/upload_route.py)."""
TRUSTED_PROXIES_SETTING = "ESLAB_TRUSTED_PROXIES"


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
            ) as cluster:
                scheduler = Scheduler(
                    store, RayJobs(cluster.address), settings, owner=owner, revive=cluster.revive
                )
                scheduler.start()  # renews the lock taken above
                print(
                    f"scheduler: up to {settings.max_concurrent_runs} run(s) at once on "
                    f"Ray at {cluster.address}",
                    flush=True,
                )
                try:
                    return run_dashboard(host, port, notes)
                finally:
                    scheduler.shutdown()
                    if cluster.owned:
                        stop_runs_for_shutdown(
                            store, scheduler.ray_jobs, settings.stop_wait_seconds + 10
                        )
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
        # Streamlit collects every generation of garbage after each script run by default:
        # with live pages rerunning every second for each viewer, that full collection was a
        # third of the dashboard's CPU under 20 viewers (py-spy), taken from the run
        # training on the same cores. Python's own collector still runs as objects pile up.
        "--runner.postScriptGC",
        "false",
        # a served dashboard's source does not change under it: no watcher polling its files
        "--server.fileWatcherType",
        "none",
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
            terminate(dashboard, timeout=10)


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
