"""The Sink: the only way the trainer reports what a user may watch.

The trainer knows nothing of databases or files; it hands plain records to a Sink. jobs/
provides the database sink; `JsonlSink` here writes JSON lines for `eslab train --no-db`.
The trackers of `report_to` (engine/reporters: TensorBoard, W&B) are Reporters, sinks that
also close; the trainer hands everything to a `FanoutSink` of its own sink and them.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol


@dataclass(frozen=True)
class PopulationRecord:
    """One population member at one step: its seed, raw fitness and shaped fitness."""

    member: int
    seed: int
    fitness: float | None
    shaped_fitness: float | None
    reward: float | None = None
    cost: float | None = None
    sample_rewards: list[float | None] | None = None
    """Each (prompt, sample)'s reward of this member, prompts in order then samples (None for a
    value that is not finite). With sample_costs, recorded by alignment runs: the Alignment tab
    histograms every sample of a step, as the reference does, not only the members' means."""
    sample_costs: list[float | None] | None = None


@dataclass(frozen=True)
class SampleRecord:
    """A completion the user may inspect; `member` None means the unperturbed model."""

    split: str
    prompt_index: int
    sample_index: int
    prompt: str
    completion: str
    reward: float | None
    reward_parts: dict[str, float] = field(default_factory=dict)
    member: int | None = None
    logprob: float | None = None
    kept: bool | None = None
    dropped_by: str | None = None


@dataclass(frozen=True)
class StepReport:
    """Everything of one step, written in one transaction by the database sink."""

    step: int
    metrics: dict[str, float]
    population: list[PopulationRecord] = field(default_factory=list)
    samples: list[SampleRecord] = field(default_factory=list)
    wall_time: float = field(default_factory=time.time)
    num_tokens: int = 0
    """Prompt and completion tokens the step generated, a prompt once per sample."""
    num_samples: int = 0
    """Completions the step generated. With num_tokens, what the trainer's step_report turns
    into the run's cumulative `train/num_tokens` and the per-second rates."""


class Sink(Protocol):
    def log_step(self, report: StepReport) -> None: ...

    def log_checkpoint(self, step: int, path: str) -> None: ...

    def log_event(self, level: str, message: str) -> None: ...

    def heartbeat(self, step: int) -> None:
        """After every batch the loop draws: `step` is the run's progress against its total
        steps, which counts a skipped LBES step (its batch is used up) as the reference's
        progress bar does; the metrics' global step does not count it."""
        ...


class ForwardingSink:
    """A sink that hands everything to `inner`: what wraps a sink (to rename its metrics,
    to stop at a step boundary) overrides only what it changes."""

    def __init__(self, inner: Sink) -> None:
        self.inner = inner

    def log_step(self, report: StepReport) -> None:
        self.inner.log_step(report)

    def log_checkpoint(self, step: int, path: str) -> None:
        self.inner.log_checkpoint(step, path)

    def log_event(self, level: str, message: str) -> None:
        self.inner.log_event(level, message)

    def heartbeat(self, step: int) -> None:
        self.inner.heartbeat(step)


class Reporter(Sink, Protocol):
    """A sink that holds a file or a connection open until the run ends."""

    def close(self) -> None: ...


class FanoutSink:
    """Forwards everything to `primary` first (the database sink, whose heartbeat may stop
    the run), then to each reporter; `close` closes the reporters."""

    def __init__(self, primary: Sink, reporters: list[Reporter]) -> None:
        self.primary = primary
        self.reporters = reporters

    def _all(self) -> list[Sink]:
        return [self.primary, *self.reporters]

    def log_step(self, report: StepReport) -> None:
        for sink in self._all():
            sink.log_step(report)

    def log_checkpoint(self, step: int, path: str) -> None:
        for sink in self._all():
            sink.log_checkpoint(step, path)

    def log_event(self, level: str, message: str) -> None:
        for sink in self._all():
            sink.log_event(level, message)

    def heartbeat(self, step: int) -> None:
        for sink in self._all():
            sink.heartbeat(step)

    def close(self) -> None:
        for reporter in self.reporters:
            reporter.close()


class JsonlSink:
    """Appends one JSON object a line: {"type": "step" | "checkpoint" | "event", ...}."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def _write(self, record: dict[str, Any]) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps(record, allow_nan=True) + "\n")

    def log_step(self, report: StepReport) -> None:
        self._write({"type": "step", **asdict(report)})

    def log_checkpoint(self, step: int, path: str) -> None:
        self._write({"type": "checkpoint", "step": step, "path": path, "wall_time": time.time()})

    def log_event(self, level: str, message: str) -> None:
        self._write({"type": "event", "level": level, "message": message, "wall_time": time.time()})

    def heartbeat(self, step: int) -> None:
        """A file needs no heartbeat: the foreground process is its own liveness."""


class MemorySink:
    """Keeps everything in lists: for benchmarks, notebooks and tests that read a run back."""

    def __init__(self) -> None:
        self.steps: list[StepReport] = []
        self.checkpoints: list[tuple[int, str]] = []
        self.events: list[tuple[str, str]] = []

    def log_step(self, report: StepReport) -> None:
        self.steps.append(report)

    def log_checkpoint(self, step: int, path: str) -> None:
        self.checkpoints.append((step, path))

    def log_event(self, level: str, message: str) -> None:
        self.events.append((level, message))

    def heartbeat(self, step: int) -> None:
        """Nothing to keep alive in memory."""

    def series(self, key: str) -> list[tuple[int, float]]:
        """(step, value) of metric `key` in the order it was reported."""
        return [(r.step, r.metrics[key]) for r in self.steps if key in r.metrics]
