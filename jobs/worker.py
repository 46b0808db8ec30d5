"""The Ray job's entrypoint: `python -m jobs.worker RUN_ID` runs one attempt of a run.

It loads the run and its configuration from the database, marks it running, and trains
through the database sink (each step's metrics, population rows and samples in one
transaction). It resumes from the newest checkpoint the database lists for the run, which
after `eslab resume` is the one the user resumed from (later ones were deleted with the
metrics after them).

Liveness: a background thread writes the heartbeat every ESLAB_HEARTBEAT_S seconds, so a
step that takes minutes does not look like a dead worker; the same thread notices a cancel
requested in the database.

Attempts: the worker runs one attempt of the run (`--attempt`, which the scheduler puts in
the Ray job's command; else the run's attempt when the worker starts), and every database
write it makes names that attempt. Once the attempt is over (a resume started the next one,
or the scheduler ended the run after its heartbeat went silent) the store refuses the write
(StaleAttemptError) and the worker exits at once, writing nothing more, not even a
checkpoint folder into the output_dir the next attempt uses.

Stopping (SIGTERM from Ray's stop_job, SIGINT, or a cancel seen by the heartbeat): the
current step finishes; at the step boundary the trainer saves a checkpoint when it offers a
`should_stop` hook (otherwise the sink stops it there and the last regular checkpoint
stands); the run ends cancelled. A step still running ESLAB_ABANDON_AFTER_S seconds after
the request, or a second signal, abandons the step: the run is recorded cancelled and the
process exits at once. Any other error ends the run failed with its traceback. The outcome
is recorded by jobs.outcome, for `eslab train`'s foreground runs too.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

from engine.sink import ForwardingSink, Sink
from jobs import phases
from jobs.checkpoints import latest_checkpoint
from jobs.outcome import RunOutcome
from jobs.sink import DatabaseSink
from jobs.store.errors import StaleAttemptError, StoreError
from jobs.store.status import RunStatus
from jobs.store.store import Store

log = logging.getLogger("jobs.worker")
# Said alike whether the heartbeat or a write of the step hears first that the attempt is over
_STOPS_AND_RECORDS_NOTHING = "this worker stops now and records nothing"

DEFAULT_TRAIN = "engine.trainer:train"
TRAIN_VARIABLE = "ESLAB_WORKER_TRAIN"
STOPPING_SIGNALS = (signal.SIGTERM, signal.SIGINT)
"""Names another training function, for the Ray job and `eslab train` alike (tests use a
stand-in)."""
TrainFunction = Callable[..., Path]


class StopRequested(Exception):
    """Raised by the sink at a step boundary once a stop was requested, for trainers that
    have no `should_stop` hook."""


class StopSignal:
    """Whether, and why, this worker was asked to stop; and whether a step boundary was
    reached since (until then, the step in progress may still be abandoned)."""

    def __init__(self) -> None:
        self._requested = threading.Event()
        self._boundary = threading.Event()
        self.reason = ""

    def request(self, reason: str) -> bool:
        """True the first time only."""
        if self._requested.is_set():
            return False
        self.reason = reason
        self._requested.set()
        return True

    def is_set(self) -> bool:
        return self._requested.is_set()

    def reached_boundary(self) -> None:
        if self._requested.is_set():
            self._boundary.set()

    def wait_for_boundary(self, timeout: float) -> bool:
        return self._boundary.wait(timeout)


class StoppingSink(ForwardingSink):
    """The database sink, plus: the step boundary (the trainer's per-step heartbeat) is
    where a requested stop takes effect."""

    def __init__(
        self,
        inner: Sink,
        stop: StopSignal,
        *,
        raise_at_boundary: bool,
        at_boundary: Callable[[], None] = lambda: None,
    ) -> None:
        super().__init__(inner)
        self.stop = stop
        self.raise_at_boundary = raise_at_boundary
        self.at_boundary = at_boundary
        self.last_step = 0

    def heartbeat(self, step: int) -> None:
        self.inner.heartbeat(step)
        self.last_step = step
        self.at_boundary()
        self.stop.reached_boundary()
        if self.raise_at_boundary and self.stop.is_set():
            raise StopRequested(f"stopped after step {step}: {self.stop.reason}")


class Heartbeat(threading.Thread):
    """Writes the heartbeat of one attempt every `interval` seconds and turns a cancel
    requested in the database into a stop request, and a refused heartbeat (the attempt is
    over) into `on_over`. A write that fails otherwise is logged and retried: the
    scheduler's timeout, not this thread, decides when a silent worker is dead."""

    def __init__(
        self,
        outcome: RunOutcome,
        interval: float,
        on_cancel: Callable[[str], None],
        on_over: Callable[[str], None],
    ) -> None:
        super().__init__(name="eslab-heartbeat", daemon=True)
        self.outcome, self.interval = outcome, interval
        self.on_cancel, self.on_over = on_cancel, on_over
        self._done = threading.Event()

    def run(self) -> None:
        store, run_id, attempt = self.outcome.store, self.outcome.run_id, self.outcome.attempt
        while not self._done.wait(self.interval):
            try:
                status = store.beat(run_id, attempt=attempt)
            except StaleAttemptError as exc:
                if not self.outcome.deciding():  # else the run ended by this worker's doing
                    self.on_over(str(exc))
                return
            except StoreError as exc:
                log.warning("heartbeat failed: %s", exc)
                continue
            if status is RunStatus.CANCELLING:
                self.on_cancel("cancel requested")

    def close(self) -> None:
        self._done.set()
        self.join(timeout=self.interval + 5)


class Worker:
    """One attempt of one run."""

    def __init__(
        self,
        store: Store,
        run_id: int | str,
        *,
        attempt: int | None = None,
        train: TrainFunction | str | None = None,
        heartbeat_seconds: float = 5.0,
        abandon_after_seconds: float = 30.0,
        foreground: bool = False,
        resume_from: str | Path | None = None,
        wrap_sink: Callable[[Sink], Sink] | None = None,
        release_engine: bool = True,
        start_pool: Callable[[Any, Any], Any] | None = None,
    ) -> None:
        """`foreground`: the run was created running by `eslab train`, which runs it in this
        process (no scheduler); otherwise the run must be queued and this worker claims it.
        `train`: the training function or its `module:function` (default: ESLAB_WORKER_TRAIN,
        else engine.trainer:train).
        `attempt`: the attempt this worker runs (the Ray job's command names it); None takes
        the run's attempt when the worker starts.
        `resume_from`: a checkpoint folder that overrides the newest one the database lists.
        `wrap_sink`: wraps the database sink (the command line's progress bar).
        `release_engine` False: the process exits right after the outcome is recorded (the
        Ray job's entrypoint), so the engine is left to the OS: releasing vLLM takes seconds
        (3.3 s here) that a cancel should not have to wait for.
        `start_pool`: starts the engine pool for a trainer that takes one (default:
        engine.trainer.start_pool; tests of the phases around it pass a stand-in)."""
        self.store = store
        self.run_id = run_id
        self.attempt = attempt
        self.train = train or os.environ.get(TRAIN_VARIABLE) or DEFAULT_TRAIN
        self.heartbeat_seconds = heartbeat_seconds
        self.abandon_after_seconds = abandon_after_seconds
        self.foreground = foreground
        self.resume_from = resume_from
        self.wrap_sink = wrap_sink or (lambda sink: sink)
        self.release_engine = release_engine
        self.start_pool = start_pool or _start_pool
        self.stop = StopSignal()
        self._signals = 0
        self._handling_signals = False
        self.outcome: RunOutcome | None = None  # once the run is ours

    def run(self) -> int:
        """0 when the run succeeded or was cancelled (or was not ours to run), 1 when it
        failed: Ray's job status then agrees with the run's."""
        from engine.config import RunConfig

        run = self.store.get_run(self.run_id)
        attempt = run.attempt if self.attempt is None else self.attempt
        expected = RunStatus.RUNNING if self.foreground else RunStatus.QUEUED
        if run.status is not expected or run.attempt != attempt:
            log.info(
                "run %s is %s at attempt %s, not %s at attempt %s; nothing to do",
                run.id,
                run.status.value,
                run.attempt,
                expected.value,
                attempt,
            )
            return 0
        outcome = RunOutcome(self.store, run.id, attempt)
        try:
            config = RunConfig.from_flat(run.config)
            train = load_train(self.train) if isinstance(self.train, str) else self.train
        except Exception as exc:
            outcome.failed(exc, f"cannot start: {exc}")
            return 1
        checkpoint = latest_checkpoint(self.store, run.id)
        resume_from = self.resume_from or (checkpoint.path if checkpoint else None)
        takes_pool = accepts(train, "pool")
        # A run that starts its engine is shown in that phase from its first moment running
        first_phase = phases.STARTING_ENGINE if takes_pool else None
        if not self.foreground and not self.store.start_run(
            run.id, attempt=attempt, event=first_phase
        ):
            log.info("run %s was cancelled or resumed before attempt %s started", run.id, attempt)
            return 0
        self.run_id = run.id
        self.outcome = outcome
        hooked = accepts(train, "should_stop")
        sink = StoppingSink(
            self.wrap_sink(DatabaseSink(self.store, run.id, attempt)),
            self.stop,
            raise_at_boundary=not hooked,
            at_boundary=self._keep_signal_handlers,
        )
        kwargs: dict[str, Any] = {"resume_from": resume_from}
        if hooked:
            kwargs["should_stop"] = self.stop.is_set
        if resume_from:
            log.info("run %s resumes from %s", run.id, resume_from)

        heartbeat = Heartbeat(
            outcome, self.heartbeat_seconds, self.request_stop, self._attempt_over
        )
        previous = self._install_signal_handlers()
        heartbeat.start()
        try:
            return self._train(outcome, config, train, sink, kwargs, takes_pool)
        finally:
            heartbeat.close()
            self._handling_signals = False
            _restore_signal_handlers(previous)
            if kwargs.get("pool") is not None and self.release_engine:
                kwargs["pool"].shutdown()

    def _train(
        self,
        outcome: RunOutcome,
        config: Any,
        train: TrainFunction,
        sink: StoppingSink,
        kwargs: dict[str, Any],
        takes_pool: bool,
    ) -> int:
        """Train and record the outcome. The engine is started here rather than by the
        trainer so that the outcome is recorded before it is released (see release_engine)."""
        try:
            if self.foreground:
                # Who to look for if the run is declared dead while the process lives on.
                where = f"process {os.getpid()} on {socket.gethostname()}"
                sink.log_event("info", f"`eslab train` runs this attempt in {where}")
            if takes_pool:
                kwargs["pool"] = self._start_engine(config, sink, announced=not self.foreground)
                self._keep_signal_handlers()
            output = train(config, sink, **kwargs)
        except StaleAttemptError as exc:
            log.error("%s; %s", exc, _STOPS_AND_RECORDS_NOTHING)
            return 1
        except BaseException as exc:
            if isinstance(exc, SystemExit) and exc.code in STOPPING_SIGNALS:
                # Ray's handler (see _keep_signal_handlers) got the signal before ours was back
                self.stop.request(f"{signal.Signals(exc.code).name} received")
            if self.stop.is_set():
                outcome.cancelled(f"stopped after step {sink.last_step} ({self.stop.reason})")
                return 0
            outcome.failed(exc, f"{type(exc).__name__}: {exc}")
            return 1
        outcome.succeeded(output)
        return 0

    def _start_engine(self, config: Any, sink: StoppingSink, *, announced: bool) -> Any:
        """The engine pool, its start noted in the run's events (jobs.phases) so that the
        dashboard says "starting engine" for the tens of seconds it takes. `announced`: the
        phase's event was written as the run started (Store.start_run)."""
        if not announced:
            sink.log_event("info", phases.STARTING_ENGINE)
        started = time.monotonic()
        pool = self.start_pool(config, sink)
        seconds = time.monotonic() - started
        sink.log_event("info", phases.engine_started(seconds, pool.devices()))
        return pool

    # -- signals ------------------------------------------------------------------------

    def _install_signal_handlers(self) -> dict[int, Any]:
        if threading.current_thread() is not threading.main_thread():
            return {}  # only the main thread may set handlers (tests run workers in threads)
        previous = {}
        for sig in STOPPING_SIGNALS:
            previous[sig] = signal.signal(sig, self._on_signal)
        self._handling_signals = True
        return previous

    def _keep_signal_handlers(self) -> None:
        """Put this worker's handlers back where something replaced them. ray.init does, in
        a worker whose engines are Ray actors: its SIGTERM handler exits at once, from inside
        whatever the step waits on, so a cancel (Ray's stop_job sends SIGTERM) would end the
        run failed in the middle of a checkpoint instead of cancelled at the step's end."""
        if not self._handling_signals:
            return
        for sig in STOPPING_SIGNALS:
            if signal.getsignal(sig) != self._on_signal:
                signal.signal(sig, self._on_signal)

    def request_stop(self, reason: str) -> None:
        """Stop at the next step boundary; the watchdog abandons a step that will not end."""
        if self.stop.request(reason):
            log.info("%s: stopping at the end of the step", reason)
            _thread(self._watchdog)

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        self._signals += 1
        # The database writes happen in threads: the interrupted main thread may be inside
        # a transaction that a write from this handler would wait for.
        if self._signals == 1:
            self.request_stop(f"{name} received")
        else:
            log.info("second signal (%s): abandoning the step in progress", name)
            _thread(self._abandon, f"a second signal, {name}")

    def _watchdog(self) -> None:
        if not self.stop.wait_for_boundary(self.abandon_after_seconds):
            self._abandon(
                f"the step was still running {self.abandon_after_seconds:g} s after "
                "the stop request"
            )

    def _attempt_over(self, why: str) -> None:
        """This attempt may no longer write (its heartbeat was refused): exit now, from the
        heartbeat thread, because the main thread may be deep in a step that ends with a
        checkpoint folder written where the next attempt writes its own."""
        log.error("%s; %s", why, _STOPS_AND_RECORDS_NOTHING)
        logging.shutdown()
        os._exit(1)

    def _abandon(self, why: str) -> None:
        """Record the run cancelled and exit now: the step in progress is lost, the last
        checkpoint stands. os._exit, because the main thread may be deep in the engine."""
        if self.outcome is not None:
            self.outcome.cancelled(f"step abandoned ({why})")
        logging.shutdown()
        os._exit(0)


# -- helpers ------------------------------------------------------------------------------


def accepts(train: TrainFunction, parameter: str) -> bool:
    """Whether the training function takes this keyword (stand-in trainers of the tests
    take neither `should_stop` nor `pool`)."""
    try:
        return parameter in inspect.signature(train).parameters
    except (TypeError, ValueError):
        return False


def _start_pool(config: Any, sink: Any) -> Any:
    from engine.trainer import start_pool  # vLLM: only in a worker that trains

    return start_pool(config, sink)


def load_train(spec: str) -> TrainFunction:
    """`module:function` -> the function (tests run the worker with a stand-in trainer)."""
    module_name, _, name = spec.partition(":")
    if not module_name or not name:
        raise SystemExit(f"--train must look like module:function, got {spec!r}")
    return getattr(importlib.import_module(module_name), name)


def _thread(target: Callable[..., None], *args: Any) -> None:
    threading.Thread(target=target, args=args, name="eslab-stop", daemon=True).start()


def _restore_signal_handlers(previous: dict[int, Any]) -> None:
    for sig, handler in previous.items():
        signal.signal(sig, handler)


def _attempt_number(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number from 1, got {text!r}")
    return int(text)


def _seconds(name: str, default: float) -> float:
    value = os.environ.get(name)
    return float(value) if value else default


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m jobs.worker", description="Run one attempt of a queued run."
    )
    parser.add_argument("run_id", help="the run's id or uuid")
    parser.add_argument(
        "--attempt",
        type=_attempt_number,
        help="the attempt this job runs (the scheduler names it); a run at another attempt "
        "is left alone. Default: the run's attempt when the worker starts",
    )
    parser.add_argument(
        "--train",
        metavar="MODULE:FUNCTION",
        help=f"the training function (default: {TRAIN_VARIABLE} or {DEFAULT_TRAIN}; tests "
        "use a stand-in)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    store = Store()
    try:
        worker = Worker(
            store,
            args.run_id,
            attempt=args.attempt,
            train=args.train,
            heartbeat_seconds=_seconds("ESLAB_HEARTBEAT_S", 5.0),
            abandon_after_seconds=_seconds("ESLAB_ABANDON_AFTER_S", 30.0),
            release_engine=False,
        )
        code = worker.run()
    finally:
        store.close()
    # The outcome is recorded: exit now, leaving the engine's memory to the OS (a graceful
    # vLLM shutdown would keep Ray's job, and so a cancel, waiting for seconds).
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
