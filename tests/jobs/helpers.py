"""Shared by the jobs tests: a stand-in run configuration, a tiny real run, polling with a
deadline, and stand-ins for Ray's job server where a test needs exact control of it."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from engine.config import RunConfig
from engine.paths import PROJECT_ROOT
from jobs.ray_jobs import JobState
from jobs.store.records import RunRecord
from jobs.store.store import Store

T = TypeVar("T")

STANDIN = "tests.jobs.standin"
CONCISENESS = PROJECT_ROOT / "data" / "conciseness"  # shipped with the repository


def standin_config(output_dir: Path, **options: Any) -> RunConfig:
    """A valid run configuration for tests/jobs/standin.py (it reads max_steps,
    population_size, the save strategy, output_dir and the reward function)."""
    return RunConfig.from_flat(
        {
            "method": "es",
            "train_file": "data/unused.parquet",
            "output_dir": str(output_dir),
            "reward_func_path": f"{STANDIN}.reward",
            "max_steps": 6,
            "population_size": 4,
            "save_strategy": "steps",
            "save_steps": 2,
            **options,
        }
    )


def queue_run(store: Store, output_dir: Path, name: str = "standin", **options: Any) -> RunRecord:
    config = standin_config(output_dir, **options)
    return store.create_run(
        name=name, method="es", config=config.to_flat(), total_steps=config.data.max_steps
    )


def queue_real_run(store: Store, tmp_path: Path, name: str = "e2e", **options: Any) -> RunRecord:
    """A tiny real run (the default model on vLLM, conciseness, two members, two steps of
    4-token answers, a checkpoint a step) queued in `store`, its output in `tmp_path`/out."""
    from engine.trainer import plan_total_steps

    config = RunConfig.from_flat(
        {
            "method": "es",
            "train_file": str(CONCISENESS / "train.parquet"),
            "output_dir": str(tmp_path / "out"),
            "reward_func_path": "engine.rewards.conciseness.compute_score",
            "population_size": 2,
            "data_batch_size": 2,
            "max_steps": 2,
            "max_tokens": 4,  # a decode step costs ~0.17 s on the CPU whatever the batch
            "noise_std": 0.002,
            "learning_rate": 4e-5,
            "save_strategy": "steps",
            "save_steps": 1,
            "max_model_len": 1024,
            "max_num_seqs": 16,
            **options,
        }
    )
    return store.create_run(
        name=name, method="es", config=config.to_flat(), total_steps=plan_total_steps(config)
    )


def ended(store: Store, run_id: int) -> RunRecord | None:
    """The run once it is in a terminal state, else None (for wait_for)."""
    run = store.get_run(run_id)
    return run if run.status.is_terminal() else None


def wait_for(predicate: Callable[[], T], timeout: float, what: str, interval: float = 0.1) -> T:
    """Poll until `predicate()` is truthy; fail naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def worker_pid(store: Store, run_id: int) -> int:
    """The stand-in logs its pid as an event when it starts."""
    for event in store.events(run_id):
        if event.message.startswith("pid "):
            return int(event.message.split()[1])
    raise LookupError("the worker has not started")


class RecordingRay:
    """The four answers the scheduler asks of Ray; a stopped job reads as STOPPED."""

    def __init__(self) -> None:
        self.stopped: list[str] = []

    def state(self, submission_id: str) -> JobState:
        return JobState.STOPPED if submission_id in self.stopped else JobState.RUNNING

    def stop(self, submission_id: str) -> None:
        self.stopped.append(submission_id)

    def log_tail(self, submission_id: str, chars: int) -> str:
        return "the worker's last words"

    def cluster_resources(self) -> dict[str, float]:
        return {"CPU": 2.0}


class SubmittingRay(RecordingRay):
    """RecordingRay that also takes jobs: the names of the runs submitted, and the GPUs
    each job's own process was given."""

    def __init__(self, resources: dict[str, float] | None = None) -> None:
        super().__init__()
        self.resources = resources or {"CPU": 2.0}
        self.submitted: list[str] = []
        self.job_gpus: dict[str, float] = {}

    def submit(self, submission_id, entrypoint, *, env_vars, metadata, num_gpus=0.0):
        self.submitted.append(metadata["eslab_run_name"])
        self.job_gpus[metadata["eslab_run_name"]] = num_gpus
        return True

    def cluster_resources(self) -> dict[str, float]:
        return self.resources
