"""A stand-in for engine.trainer.train with the same contract and no vLLM: it reports
metrics, population rows and samples through the sink, saves checkpoint-STEP/ folders,
resumes from them and honours `should_stop`; it takes no `pool` (the worker starts an
engine only for a trainer that takes one). Jobs tests run the real worker, scheduler and
Ray with it, in seconds; tests/jobs/test_end_to_end.py runs the real trainer.

Steps last ESLAB_STANDIN_STEP_S seconds (default 0.2). The run's reward function is
called once a step, so a raising one makes the run fail as a real reward error would.
ESLAB_STANDIN_BARRIER=FOLDER:N holds a run before its first step until N runs got there, so
runs that a test needs side by side overlap however late Ray starts one of them.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

from engine.config import RunConfig
from engine.paths import resolve_path
from engine.rewards import load_reward_function
from engine.sink import PopulationRecord, SampleRecord, Sink, StepReport

STATE_FILE = "trainer_state.json"  # the trainer's name for it


class TrainingStopped(Exception):
    """What a trainer raises after saving the checkpoint a stop request asked for."""


def reward(completion_text: str, **kwargs: object) -> dict[str, float]:
    return {"reward": -float(len(completion_text)), "format": 1.0}


def reward_failing_at_step_3(completion_text: str, step: int, **kwargs: object) -> dict:
    if step == 3:
        raise ValueError("the scorer broke at step 3")
    return reward(completion_text)


def train(
    config: RunConfig,
    sink: Sink,
    *,
    resume_from: str | Path | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> Path:
    output_dir = resolve_path(config.data.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    total = config.data.max_steps or 5
    step_seconds = float(os.environ.get("ESLAB_STANDIN_STEP_S", "0.2"))
    score = load_reward_function(config.reward.reward_func_path)
    step = 0
    if resume_from is not None:
        step = json.loads((Path(resume_from) / STATE_FILE).read_text())["global_step"]
        sink.log_event("info", f"resumed from {resume_from} at step {step}")
    sink.log_event("info", f"pid {os.getpid()}")
    wait_at_barrier(os.environ.get("ESLAB_STANDIN_BARRIER"))
    while step < total:
        time.sleep(step_seconds)
        step += 1
        value = score("x" * step, step=step)["reward"]
        sink.log_step(_report(config, step, value))
        saved = False
        every = config.eval.save_steps or 0
        if config.eval.save_strategy == "steps" and (step % every == 0 or step == total):
            sink.log_checkpoint(step, str(save(output_dir, step)))
            saved = True
        sink.heartbeat(step)
        if should_stop is not None and should_stop() and step < total:
            if not saved:
                sink.log_checkpoint(step, str(save(output_dir, step)))
            raise TrainingStopped(f"stopped after step {step}")
    (output_dir / "final.json").write_text(json.dumps({"global_step": step}))
    return output_dir


def wait_at_barrier(barrier: str | None, timeout_s: float = 60) -> None:
    """Wait until FOLDER holds N files, this run's included (see the module's docstring)."""
    if not barrier:
        return
    folder, count = barrier.rsplit(":", 1)
    Path(folder).mkdir(parents=True, exist_ok=True)
    (Path(folder) / str(os.getpid())).touch()
    deadline = time.monotonic() + timeout_s
    while len(list(Path(folder).iterdir())) < int(count):
        if time.monotonic() > deadline:
            raise TimeoutError(f"fewer than {count} runs reached {folder} in {timeout_s:.0f} s")
        time.sleep(0.05)


def train_under_rays_handler(
    config: RunConfig,
    sink: Sink,
    *,
    resume_from: str | Path | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> Path:
    """A trainer that first does what ray.init does to a driver: a SIGTERM handler that
    exits at once (engines in Ray actors bring it into the worker)."""
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(signum))
    return train(config, sink, resume_from=resume_from, should_stop=should_stop)


def train_without_hook(
    config: RunConfig, sink: Sink, *, resume_from: str | Path | None = None
) -> Path:
    """A trainer that cannot be asked to stop (the worker then stops it through the sink)."""
    return train(config, sink, resume_from=resume_from)


def save(output_dir: Path, step: int) -> Path:
    path = output_dir / f"checkpoint-{step}"
    partial = output_dir / f".checkpoint-{step}.partial"
    partial.mkdir(parents=True, exist_ok=True)
    (partial / STATE_FILE).write_text(json.dumps({"global_step": step, "epoch": 0, "batch": 0}))
    shutil.rmtree(path, ignore_errors=True)
    partial.rename(path)
    return path


def _report(config: RunConfig, step: int, value: float) -> StepReport:
    n = config.es.population_size
    return StepReport(
        step=step,
        metrics={
            "train/reward/mean": value,
            "train/noise_std": config.es.noise_std,
            "train/learning_rate": config.es.learning_rate,
        },
        population=[
            PopulationRecord(member=m, seed=1000 * step + m, fitness=value + m, shaped_fitness=m)
            for m in range(n)
        ],
        samples=[
            SampleRecord(
                split="train",
                prompt_index=i,
                sample_index=0,
                prompt=f"prompt {i}",
                completion="x" * step,
                reward=value,
                reward_parts={"format": 1.0},
                member=0,
            )
            for i in range(2)
        ],
    )
