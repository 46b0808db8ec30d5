"""The scheduler: turns queued runs into Ray jobs and keeps run statuses true.

A tick every few seconds (APScheduler BackgroundScheduler) does, in order:
1. stop the Ray job of every running run whose heartbeat is older than the timeout (a frozen
   or unreachable worker). This step only reads the database: a worker frozen in the
   middle of a write holds SQLite's write lock, and nothing else can be written until Ray
   has killed it. A silent foreground run (`eslab train`, no Ray job) is only noted: its
   process is not ours to stop. While the database refuses the scheduler's own requests
   (another process holds SQLite's lock, a PostgreSQL server restarts), the workers wait for
   it too (jobs.sink): for up to ESLAB_DB_WAIT_S nobody is stopped for silence, and once
   the database is back silence counts from then;
2. renew the scheduler lock; a scheduler without it does nothing, so one scheduler runs per
   database even when two `eslab serve` share it;
3. sync every active run with its Ray job: a job that ended while the run is not ended
   means the worker died (run failed, with the tail of the job log); a cancelling run's job
   is stopped; a run stopped in step 1 is failed with the reason. A foreground run noted in
   step 1 is failed, or cancelled if a cancel was waiting for it; should its process still
   live, its attempt is over and its next write is refused, which stops it;
4. advance the active sweeps (jobs.sweeps.driver): stop early the runs their rules give up
   on, queue their next trials as ordinary runs;
5. submit queued runs, oldest first, while fewer than `max_concurrent_runs` are active and
   the Ray cluster has the CPUs/GPUs they ask for.

All state lives in the database and in Ray, none in this object: a restarted scheduler picks
up where the last one stopped (docs/design.md, "The flow of a run").
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import shlex
import signal
import socket
import sys
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import psutil
from sqlalchemy.engine import make_url

from engine.backends.arrangement import plan
from engine.backends.vllm.cpu.resources import RUNS_SHARING_SETTING
from engine.paths import (
    INPUT_ROOTS_SETTING,
    OUTPUT_ROOTS_SETTING,
    PROJECT_ROOT,
    data_dir,
    extra_roots,
)
from jobs.liveness import silent_seconds
from jobs.outcome import with_log_tail
from jobs.private_files import write_private
from jobs.ray_jobs import JobState, RayJobs, RayUnavailableError, SubmitError
from jobs.sink import database_wait_seconds
from jobs.store.errors import DatabaseUnavailableError, StaleAttemptError
from jobs.store.records import RunRecord
from jobs.store.status import RunStatus
from jobs.store.store import Store
from jobs.sweeps.driver import advance_sweeps

log = logging.getLogger(__name__)

LOCK_NAME = "scheduler"
TICK_JOB_ID = "eslab-scheduler-tick"


@dataclass(frozen=True)
class SchedulerSettings:
    """How the scheduler paces and polices runs; `from_env` reads ESLAB_* overrides."""

    max_concurrent_runs: int = 1
    """Runs at once. One by default: on a CPU machine runs side by side share the cores (each
    engine takes its share of them, through ESLAB_CPU_RUNS_SHARING in the job's environment),
    and on 2 cores two runs at once each stepped 3 times slower than one alone
    (docs/benchmarks.md)."""
    tick_seconds: float = 3.0
    """Seconds between ticks: how soon a queued run starts and a dead one is noticed."""
    heartbeat_seconds: float = 5.0
    """How often a worker writes its heartbeat (passed to the worker)."""
    heartbeat_timeout_seconds: float = 120.0
    """A running run whose last heartbeat is older than this is failed. Generous, because a
    busy database or a paused machine must not kill healthy runs."""
    stop_wait_seconds: float = 60.0
    """After a stop, the time Ray leaves a worker to save its checkpoint before SIGKILL."""
    lock_lease_seconds: float = 30.0
    """How long the lock stays ours without renewal; a successor waits at most this long
    after a scheduler crashed."""
    log_tail_chars: int = 4000

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] = os.environ, **overrides: Any
    ) -> SchedulerSettings:
        names = {
            "max_concurrent_runs": ("ESLAB_MAX_CONCURRENT_RUNS", int),
            "tick_seconds": ("ESLAB_SCHEDULER_TICK_S", float),
            "heartbeat_seconds": ("ESLAB_HEARTBEAT_S", float),
            "heartbeat_timeout_seconds": ("ESLAB_HEARTBEAT_TIMEOUT_S", float),
            "stop_wait_seconds": ("ESLAB_STOP_WAIT_S", float),
        }
        values: dict[str, Any] = {}
        for field_name, (var, kind) in names.items():
            if environ.get(var):
                try:
                    value = kind(environ[var])
                except ValueError:
                    value = None
                # Zero or less would, for the heartbeat timeout, fail every healthy run.
                if value is None or not math.isfinite(value) or value <= 0:
                    raise ValueError(
                        f"{var} must be a finite number above 0, got {environ[var]!r}"
                    ) from None
                values[field_name] = value
        return cls(**{**values, **overrides})


def default_owner() -> str:
    """Who holds the lock, in words a person can trace: host, process, and a nonce."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


def death_reason(exit_code: int | None) -> str:
    """What a worker's exit code says about its death, as a clause to add to the error.
    SIGKILL is what the kernel's out-of-memory killer sends (a shell running the entrypoint
    reports it as 128 + 9): the likeliest cause of a worker that dies without a word."""
    if exit_code in (-signal.SIGKILL, 128 + signal.SIGKILL):
        return (
            ": it was killed with SIGKILL, most often by the kernel's out-of-memory killer "
            '(`dmesg` then shows "Out of memory: Killed process"; give the run more memory '
            "or make it smaller: population_size, max_num_seqs, max_model_len), or by a kill -9"
        )
    if exit_code is not None and exit_code < 0:
        return f": it was killed by signal {signal.Signals(-exit_code).name}"
    return "" if exit_code is None else f" (exit code {exit_code})"


def owner_is_gone(owner: str) -> bool:
    """Whether the lock holder `owner` (default_owner's words) was a process of this machine
    that no longer exists: killed without releasing the lock. A pid given since to another
    process reads as alive, and the lock is then waited for as before."""
    host, _, rest = owner.partition(":")
    pid = rest.partition(":")[0]
    return host == socket.gethostname() and pid.isdigit() and not psutil.pid_exists(int(pid))


def lock_holder_message(store: Store) -> str:
    holder = store.lock_holder(LOCK_NAME)
    if holder is None:
        return "no scheduler holds the lock"
    return (
        f"another scheduler ({holder.owner}) runs on this database; its lease ends "
        f"{holder.expires_at:%Y-%m-%d %H:%M:%S} UTC unless it renews it"
    )


def submission_id(run: RunRecord) -> str:
    """The run's uuid for its first attempt; Ray refuses a reused id, so a resumed run's
    later attempts are `uuid-N`."""
    return run.uuid if run.attempt <= 1 else f"{run.uuid}-{run.attempt}"


def worker_entrypoint(run: RunRecord) -> str:
    """The Ray job's command: the worker module, with the interpreter of this process (the
    project is installed in it, so the job needs no working_dir upload), for this attempt
    (a job that starts after its attempt was given up leaves the next one alone)."""
    return f"{shlex.quote(sys.executable)} -m jobs.worker {run.id} --attempt {run.attempt}"


def run_demand(config: Mapping[str, Any], *, gpus: bool) -> dict[str, float]:
    """What a run occupies while it runs: on a GPU cluster its engines' GPUs
    (`tensor_parallel_size` each, shared by `engines_per_gpu` engines as their Ray actors
    ask; one card's worth with auto, however many engines share it), on a CPU-only one a
    CPU an engine (engine/backends/arrangement.py, `plan`)."""
    return plan(config, gpus=gpus).demand


def job_gpus(config: Mapping[str, Any], *, gpus: bool) -> float:
    """GPUs the Ray job's own process needs: a run of one engine computes inside the job
    (its `tensor_parallel_size` GPUs); engines in Ray actors (several, or auto's, however
    many it chooses) ask for their GPUs themselves, so the job holds none."""
    return plan(config, gpus=gpus).job_gpus


class Scheduler:
    """One scheduler per database. `start()` takes the lock and starts the ticks; `tick()`
    is public so that tests and tools can run one pass deterministically."""

    def __init__(
        self,
        store: Store,
        ray_jobs: RayJobs,
        settings: SchedulerSettings | None = None,
        *,
        entrypoint: Callable[[RunRecord], str] = worker_entrypoint,
        job_env: Mapping[str, str] | None = None,
        owner: str | None = None,
        revive: Callable[[], str | None] | None = None,
    ) -> None:
        """`revive`, called at every tick, starts the serve's own Ray head again when it has
        stopped and returns the new head's address (jobs.ray_head.Cluster.revive)."""
        self.store = store
        self.ray_jobs = ray_jobs
        self.revive = revive
        self.settings = settings or SchedulerSettings.from_env()
        self.entrypoint = entrypoint
        self.extra_env = dict(job_env or {})
        self.owner = owner or default_owner()
        self._background: Any = None
        self._warned_too_big: set[int] = set()
        self._holds_lock = False
        """The outcome of the last renewal that reached the database. A renewal that fails
        because the database is locked leaves it as it was: nobody else can have taken the
        lock while nothing can be written."""
        self._outage_since: float | None = None
        """When (time.monotonic) the database stopped taking this scheduler's requests."""
        self._back_at: datetime | None = None
        """When (database time) it took them again after the last outage."""
        self._silenced: dict[int, str] = {}
        """Runs that step 1 found silent (and stopped the job of, if they have one), with the
        reason to record."""

    # -- lifecycle ----------------------------------------------------------------------

    def start(self) -> bool:
        """Take the lock and tick in the background. False, and nothing started, when
        another scheduler holds the lock (see `holder_message`)."""
        self._holds_lock = self._renew_lock()
        if not self._holds_lock:
            return False
        from apscheduler.schedulers.background import BackgroundScheduler

        self._background = BackgroundScheduler(
            timezone=UTC, job_defaults={"coalesce": True, "max_instances": 1}
        )
        self._background.add_job(
            self.tick,
            "interval",
            seconds=self.settings.tick_seconds,
            id=TICK_JOB_ID,
            replace_existing=True,
            next_run_time=datetime.now(UTC),
        )
        self._background.start()
        log.info("scheduler %s started (tick every %ss)", self.owner, self.settings.tick_seconds)
        return True

    def shutdown(self) -> None:
        """Stop ticking (waiting for a tick in progress) and give the lock up at once, so
        a successor starts without waiting for the lease to expire."""
        if self._background is not None:
            self._background.shutdown(wait=True)
            self._background = None
        self.store.release_lock(LOCK_NAME, self.owner)

    @property
    def running(self) -> bool:
        return self._background is not None

    def holder_message(self) -> str:
        return lock_holder_message(self.store)

    # -- one pass -----------------------------------------------------------------------

    def tick(self) -> None:
        """One pass: a new Ray head if ours stopped, stop silent workers, lock, sync, sweeps,
        submit. Never raises: a failing tick is logged and the next one tries again
        (APScheduler would only log it less clearly)."""
        try:
            if self.revive is not None and (address := self.revive()) is not None:
                self.ray_jobs = RayJobs(address)
            if self._holds_lock and not self._in_grace():
                self._stop_silent_workers()
            self._holds_lock = self._renew_lock()
            self._database_back()
            if not self._holds_lock:
                log.warning("scheduler %s lost its lock: %s", self.owner, self.holder_message())
                return
            active = self.store.active_runs()
            for run in active:
                self._sync(run)
            active_ids = {run.id for run in active}
            self._silenced = {i: why for i, why in self._silenced.items() if i in active_ids}
            advance_sweeps(self.store)  # logs a sweep that fails; the submissions go on
            self._submit_queued()
        except RayUnavailableError as exc:
            log.warning("scheduler tick skipped: %s", exc)
        except DatabaseUnavailableError as exc:
            if self._outage_since is None:
                self._outage_since = time.monotonic()
            log.warning("scheduler tick skipped, the database does not answer: %s", exc)
        except Exception:
            log.exception("scheduler tick failed")

    def _in_grace(self) -> bool:
        """While the database does not take this scheduler's writes, for up to the time a
        worker waits for it (jobs.sink, ESLAB_DB_WAIT_S), silence is not the workers' doing:
        they wait too. Past that, a worker frozen in the middle of its write (which holds
        SQLite's lock) is stopped as any silent one."""
        since = self._outage_since
        return since is not None and time.monotonic() - since < database_wait_seconds()

    def _database_back(self) -> None:
        """The database took a write again: silence is measured from now at the earliest,
        so the workers' own retries have time to land."""
        if self._outage_since is not None:
            self._outage_since = None
            self._back_at = self.store.database_now()

    def _renew_lock(self) -> bool:
        return self.store.acquire_lock(LOCK_NAME, self.owner, self.settings.lock_lease_seconds)

    # -- keeping statuses true ----------------------------------------------------------

    def _sync(self, run: RunRecord) -> None:
        sid = run.ray_submission_id
        if sid is None:
            self._sync_foreground(run)
            return
        state = self.ray_jobs.state(sid)
        if run.status is RunStatus.CANCELLING:
            if state.is_terminal():
                self._finish(run, RunStatus.CANCELLED, None, "its Ray job ended while cancelling")
            else:
                self.ray_jobs.stop(sid)  # idempotent; Ray escalates to SIGKILL by itself
            return
        if state is JobState.MISSING and run.status is RunStatus.QUEUED:
            # Submitted to a Ray cluster that has since gone (restart): submit it again.
            self.store.clear_submission(run.id)
            return
        if run.id in self._silenced:
            tail = self.ray_jobs.log_tail(sid, self.settings.log_tail_chars)
            reason = self._silenced.pop(run.id)
            self._finish(run, RunStatus.FAILED, with_log_tail(reason, tail), "heartbeat timeout")
            return
        if state.is_terminal():
            # The worker records its own outcome before it exits; a job that ended while the
            # run has not means the worker died (kill -9, out of memory, import error).
            tail = self.ray_jobs.log_tail(sid, self.settings.log_tail_chars)
            death = death_reason(self.ray_jobs.exit_code(sid))
            self._finish(
                run,
                RunStatus.FAILED,
                with_log_tail(
                    f"the worker's Ray job {sid} {state.message} before the run ended{death}",
                    tail,
                ),
                f"Ray job {state.value}",
            )

    def _sync_foreground(self, run: RunRecord) -> None:
        """`eslab train` records its own outcome (and its heartbeat thread turns a cancel
        requested here into a stop); only a run that step 1 found silent is ended here, as
        cancelled when a cancel was waiting for it (its last checkpoint stands)."""
        reason = self._silenced.pop(run.id, None)
        if reason is None:
            return
        if run.status is RunStatus.CANCELLING:
            self._finish(run, RunStatus.CANCELLED, None, reason)
        else:
            self._finish(run, RunStatus.FAILED, reason, "heartbeat timeout")

    def _stop_silent_workers(self) -> None:
        """Stop the job of each running run whose heartbeat is older than the timeout, and
        note each silent foreground run. Reads and Ray calls only (see step 1 of the module
        docstring); `_sync` records the outcome once the database takes writes again."""
        timeout = self.settings.heartbeat_timeout_seconds
        now = self.store.database_now()  # the clock the heartbeats were written in
        since_back = None if self._back_at is None else (now - self._back_at).total_seconds()
        for run in self.store.active_runs():
            silent = silent_seconds(run, now)
            if silent is not None and since_back is not None:
                silent = min(silent, since_back)
            sid = run.ray_submission_id
            if silent is None or silent <= timeout or run.id in self._silenced:
                continue
            limit = f"{silent:.0f} s (timeout {timeout:.0f} s, ESLAB_HEARTBEAT_TIMEOUT_S)"
            if sid is None:
                self._silenced[run.id] = (
                    f"no heartbeat from its foreground `eslab train` process for {limit}: it "
                    "was killed, froze or lost the database. That process is not the "
                    "scheduler's to stop; if it still lives, its next write is refused and "
                    "it stops itself"
                )
            elif run.status is RunStatus.RUNNING:  # a cancelling run's job is stopped by _sync
                self.ray_jobs.stop(sid)
                self._silenced[run.id] = (
                    f"no heartbeat from the worker for {limit}: the worker froze or lost the "
                    "database; its job was stopped"
                )
            else:
                continue
            log.warning("run %s: %s", run.id, self._silenced[run.id])

    def _finish(self, run: RunRecord, status: RunStatus, error: str | None, why: str) -> None:
        """End the attempt `run` was listed at; a run resumed since is left alone."""
        event = f"scheduler marked the run {status.value}: {why}"
        try:
            ended = self.store.finish_run(
                run.id, status, error=error, event=event, attempt=run.attempt
            )
        except StaleAttemptError as exc:
            log.info("%s; left alone", exc)
            return
        if ended:
            log.info("run %s %s: %s", run.id, status.value, why)

    # -- starting runs ------------------------------------------------------------------

    def _submit_queued(self) -> None:
        queued = self.store.queued_runs(limit=self.settings.max_concurrent_runs * 4 + 10)
        if not queued:
            return
        # Foreground `eslab train` runs have no Ray job and take no Ray resources.
        active = [r for r in self.store.active_runs() if r.ray_submission_id]
        if len(active) >= self.settings.max_concurrent_runs:
            return
        total = self.ray_jobs.cluster_resources()
        if not total:
            # No live node listed yet (a head whose node has not registered, or a state API
            # too slow to answer under load): nothing is known to fit or not; next tick.
            log.info("Ray lists no live node yet; queued runs wait")
            return
        gpus = total.get("GPU", 0.0) > 0
        used: dict[str, float] = {}
        for run in active:
            _add(used, run_demand(run.config, gpus=gpus))
        for run in queued:
            if len(active) >= self.settings.max_concurrent_runs:
                return
            need = run_demand(run.config, gpus=gpus)
            if not _fits(need, {}, total):
                self._warn_never_fits(run, need, total)
                continue  # it can never start here; do not let it block the queue
            if not _fits(need, used, total):
                return  # first in, first out: later runs wait for this one
            if self._submit(run, job_gpus(run.config, gpus=gpus)):
                _add(used, need)
                active.append(run)

    def _submit(self, run: RunRecord, num_gpus: float = 0.0) -> bool:
        sid = submission_id(run)
        if not self.store.mark_submitted(run.id, sid):
            return False  # cancelled since it was listed
        try:
            created = self.ray_jobs.submit(
                sid,
                self.entrypoint(run),
                env_vars=self.job_env(),
                metadata={"eslab_run_id": str(run.id), "eslab_run_name": run.name},
                num_gpus=num_gpus,
            )
        except RayUnavailableError:
            self.store.clear_submission(run.id)  # retried next tick
            raise
        except SubmitError as exc:
            self._finish(run, RunStatus.FAILED, str(exc), "Ray refused the job")
            return False
        how = "submitted" if created else "was already submitted"
        self.store.add_event(run.id, "info", f"Ray job {sid} {how} (attempt {run.attempt})")
        log.info("run %s: Ray job %s %s", run.id, sid, how)
        return True

    def _warn_never_fits(
        self, run: RunRecord, need: dict[str, float], total: dict[str, float]
    ) -> None:
        if run.id in self._warned_too_big:
            return
        self._warned_too_big.add(run.id)
        wants = ", ".join(f"{v:g} {k}" for k, v in need.items())
        has = ", ".join(f"{total.get(k, 0):g} {k}" for k in need)
        self.store.add_event(
            run.id,
            "warning",
            f"waiting: the run needs {wants} but the Ray cluster has {has} in all; lower "
            "num_engines / tensor_parallel_size, or add nodes",
        )

    def job_env(self) -> dict[str, str]:
        """What the worker needs to find the same database and code as this process. The
        job has no working_dir (nothing is uploaded), so paths must be absolute."""
        env = {
            **_database_env(self.store.engine.url),
            "PYTHONPATH": os.pathsep.join(
                p for p in (str(PROJECT_ROOT), os.environ.get("PYTHONPATH", "")) if p
            ),
            "ESLAB_HEARTBEAT_S": str(self.settings.heartbeat_seconds),
            # Ray reads this in the job's supervisor: the time between SIGTERM and SIGKILL.
            "RAY_JOB_STOP_WAIT_TIME_S": str(int(self.settings.stop_wait_seconds)),
            "ESLAB_ABANDON_AFTER_S": str(self.settings.stop_wait_seconds / 2),
            # A CPU engine takes its share of the node's cores, so that the runs side by side
            # do not oversubscribe them (engine/backends/vllm/cpu/resources.py).
            RUNS_SHARING_SETTING: str(self.settings.max_concurrent_runs),
        }
        from engine.rewards import REWARD_MODULES_SETTING

        # Always set, empty included: the worker allows the reward modules this process
        # validated the run against, never a wider list inherited from the Ray head.
        env[REWARD_MODULES_SETTING] = os.environ.get(REWARD_MODULES_SETTING, "")
        return {**env, **_path_env(), **self.extra_env}


def _path_env() -> dict[str, str]:
    """The data folder and the extra input and output roots as this process resolved them,
    each always set (empty included): the worker validates the run's paths again, and must
    never fall back to the folders the Ray head was started with."""
    return {
        "ESLAB_DATA_DIR": str(data_dir().absolute()),
        **{
            setting: os.pathsep.join(str(root) for root in extra_roots(setting))
            for setting in (OUTPUT_ROOTS_SETTING, INPUT_ROOTS_SETTING)
        },
    }


def _database_env(url: Any) -> dict[str, str]:
    """How the worker finds the database. SQLite paths are made absolute (a Ray job starts
    in another folder). A URL with a password goes into a file only this user can read, in
    the data folder, named by ESLAB_DATABASE_URL_FILE: Ray shows a job's environment
    variables on its dashboard. (On a multi-node cluster that file must exist at the same
    path on every node that runs jobs: a data folder they share.)"""
    if url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:"):
        url = url.set(database=os.path.abspath(url.database))
    rendered = make_url(url).render_as_string(hide_password=False)
    if not url.password:
        return {"ESLAB_DATABASE_URL": rendered}
    digest = hashlib.sha256(rendered.encode()).hexdigest()[:16]
    path = write_private(f"database-url-{digest}", rendered)
    # Empty, so that a URL the job inherits from the Ray head's environment cannot win.
    return {"ESLAB_DATABASE_URL": "", "ESLAB_DATABASE_URL_FILE": str(path)}


def _add(total: dict[str, float], extra: Mapping[str, float]) -> None:
    for name, amount in extra.items():
        total[name] = total.get(name, 0.0) + amount


def _fits(need: Mapping[str, float], used: Mapping[str, float], total: Mapping[str, float]) -> bool:
    return all(used.get(k, 0.0) + v <= total.get(k, 0.0) + 1e-9 for k, v in need.items())
