"""What a running run is doing before its steps start: its engine starting. Loading the model
into vLLM takes tens of seconds on a CPU, during which the step stays at its last value;
without a word for it, the dashboard showed a run at step 0 where nothing moved.

The worker notes the engine's start and its end as events of the run (the run's log), so
the phase and when it began need no column of their own, and the log keeps how long each
start took. One place names the two events: the worker writes them, the pages read them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from jobs.liveness import in_words, status_label
from jobs.store.records import EventRecord, RunRecord
from jobs.store.status import RunStatus
from jobs.store.store import Store

STARTING_ENGINE = "starting engine"
ENGINE_STARTED = "engine started"


_PLACES = " on "
_PLACE_SEPARATOR = "; "


def engine_started(seconds: float, devices: Sequence[str] = ()) -> str:
    """The event that ends the phase, with how long the start took and where the engines
    compute (EnginePool.devices, one per engine)."""
    where = f"{_PLACES}{_PLACE_SEPARATOR.join(devices)}" if devices else ""
    return f"{ENGINE_STARTED} in {seconds:.1f} s{where}"


def engine_places(events: Sequence[EventRecord]) -> list[str]:
    """Where the run's engines computed at their latest start, one entry per engine (the
    places `engine_started` wrote); empty before a start, or for a start that named none."""
    for event in reversed(events):
        if event.message.startswith(ENGINE_STARTED):
            _, found, places = event.message.partition(_PLACES)
            return places.split(_PLACE_SEPARATOR) if found and places else []
    return []


@dataclass(frozen=True)
class Phase:
    """A named phase of a running run and when it began (UTC)."""

    name: str
    since: datetime

    def seconds(self, now: datetime | None = None) -> float:
        return max(0.0, ((now or datetime.now(UTC)) - self.since).total_seconds())


def current_phase(run: RunRecord, events: Sequence[EventRecord]) -> Phase | None:
    """`starting engine` while the run is running and the newest of the two events is the
    start's; None otherwise (its steps are running, or the run is not). `events` oldest
    first, as the store lists them."""
    if run.status is not RunStatus.RUNNING:
        return None
    for event in reversed(events):
        if event.message == STARTING_ENGINE:
            return Phase(STARTING_ENGINE, event.created_at)
        if event.message.startswith(ENGINE_STARTED):
            return None
    return None


def phase_of(store: Store, run: RunRecord) -> Phase | None:
    """`current_phase` from the store; reads the events of running runs only."""
    return current_phase(run, store.events(run.id)) if run.status is RunStatus.RUNNING else None


def status_text(run: RunRecord, phase: Phase | None, timeout: float, now: datetime) -> str:
    """The run's status (marked stale when its worker fell silent by `now`, the database's
    time), with the phase a running run is in and for how long: `running: starting engine
    (42 s)`. The Runs page and `eslab runs` say it alike."""
    text = status_label(run, timeout, now)
    return f"{text}: {phase.name} ({in_words(phase.seconds())})" if phase else text
