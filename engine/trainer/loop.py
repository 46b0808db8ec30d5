"""The ES and LBES training loop, top to bottom: set up, then for each step perturb and
evaluate every member, shape the fitness, update, and report; evaluate and save by their
strategies; save the final model.

The steps themselves are engine/trainer/es_step.py and lbes_step.py (docs/algorithms.md).
The trainer reports only through a Sink and touches weights only through an EnginePool.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from engine.alignment.aligner import Aligner
from engine.backends.base import EvaluationStopped
from engine.backends.pool import EnginePool
from engine.config import RunConfig
from engine.lowrank.population import LoraPopulation
from engine.paths import resolve_path
from engine.schedules import schedule_value
from engine.sink import Sink
from engine.trainer.checkpoints import Checkpoints, TrainerState
from engine.trainer.es_step import es_step
from engine.trainer.evaluation import evaluate
from engine.trainer.lbes_step import lbes_step
from engine.trainer.preflight import load_data, start_lora, start_pool
from engine.trainer.reporting import logging_due, step_report


class TrainingStopped(Exception):
    """Raised after a stop asked for through `should_stop`, once the checkpoint is saved."""


def train(
    config: RunConfig,
    sink: Sink,
    *,
    pool: EnginePool | None = None,
    resume_from: str | Path | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> Path:
    """Run `config` to the end; returns the folder of the final model. `should_stop` is
    asked after every step: when it says yes, the step's checkpoint is saved (if the save
    strategy did not just save it) and TrainingStopped is raised (the worker's cancel)."""
    # -- setup
    data = load_data(config)
    output_dir = resolve_path(config.data.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    owns_pool = pool is None
    pool = pool or start_pool(config)
    lora = None
    try:
        lora = start_lora(config, sink)
        checkpoints = Checkpoints(config, pool, output_dir, lora, sink)
        state = TrainerState() if resume_from is None else checkpoints.resume(resume_from)
        aligner = Aligner.for_run(config, state.alignment)
        step_fn = _step_function(config, lora, aligner)
        evaluating = config.eval.eval_strategy != "no"
        if evaluating and config.eval.eval_before_train and state.global_step == 0:
            sink.log_step(evaluate(config, pool, data.eval_set, step=0))

        # -- the loop
        skipped = 0
        while state.global_step < data.total_steps:
            started = time.perf_counter()
            examples = data.examples(state.position)
            position, epoch_ended = data.batches.advance(state.position)
            noise_std, learning_rate = current_schedules(
                config, state.global_step, data.total_steps
            )
            try:
                report = step_fn(
                    config,
                    pool,
                    examples,
                    state.global_step,
                    noise_std,
                    learning_rate,
                    stop=should_stop,
                )
            except EvaluationStopped:
                # Stopped between members, before this step's update: the weights are still
                # those of the last finished step, which is what the checkpoint records.
                checkpoints.save_for_resume(state)
                raise TrainingStopped(
                    f"stopped during step {state.global_step + 1}, "
                    f"checkpoint of step {state.global_step} saved"
                ) from None
            if report is None:
                # LBES found nothing informative: the step and the schedules do not advance.
                state = TrainerState(
                    state.global_step, position.epoch, position.batch, totals=state.totals
                )
                skipped += 1
                _warn_skipped(sink, state.global_step + 1, skipped, data.batches.per_epoch)
                continue
            skipped = 0
            state = TrainerState(
                state.global_step + 1,
                position.epoch,
                position.batch,
                aligner.snapshot() if aligner is not None else None,
                state.totals,
            )
            step = state.global_step
            evaluation = (
                evaluate(config, pool, data.eval_set, step=step)
                if _due(
                    config.eval.eval_strategy,
                    config.eval.eval_steps,
                    step,
                    epoch_ended,
                    data.total_steps,
                )
                else None
            )
            report, totals = step_report(
                report,
                noise_std=noise_std,
                learning_rate=learning_rate,
                epoch=data.epoch(position),
                evaluation=evaluation,
                started=started,
                totals=state.totals,
            )
            state = replace(state, totals=totals)
            if logging_due(config, step, data.total_steps):
                sink.log_step(report)
            if _due(
                config.eval.save_strategy,
                config.eval.save_steps,
                step,
                epoch_ended,
                data.total_steps,
            ):
                checkpoints.save(state)
            sink.heartbeat(step)
            if should_stop is not None and step < data.total_steps and should_stop():
                checkpoints.save_for_resume(state)
                raise TrainingStopped(f"stopped after step {step}, checkpoint saved")

        # -- the final model
        return checkpoints.save_final()
    finally:
        if lora is not None:
            lora.close()
        if owns_pool:
            pool.shutdown()


def current_schedules(config: RunConfig, step: int, total_steps: int) -> tuple[float, float]:
    """(noise_std, learning_rate) at `step`."""
    es = config.es
    noise_std = schedule_value(
        es.noise_std_scheduler_type,
        es.noise_std,
        es.noise_std_final,
        step,
        total_steps,
        rate=es.noise_std_scheduler_rate,
        power=es.noise_std_scheduler_power,
    )
    learning_rate = schedule_value(
        es.lr_scheduler_type,
        es.learning_rate,
        es.lr_final,
        step,
        total_steps,
        rate=es.lr_scheduler_rate,
        power=es.lr_scheduler_power,
    )
    return noise_std, learning_rate


def _step_function(
    config: RunConfig, lora: LoraPopulation | None, aligner: Aligner | None
) -> Callable[..., object]:
    if config.method == "es":
        return functools.partial(es_step, lora=lora, aligner=aligner)
    return lbes_step


def _due(strategy: str, every: int | None, step: int, epoch_ended: bool, total: int) -> bool:
    """Whether an eval or save strategy ("no", "steps" or "epoch") asks for `step`."""
    if strategy == "steps":
        return step % (every or 1) == 0 or step == total
    return strategy == "epoch" and (epoch_ended or step == total)


def _warn_skipped(sink: Sink, step: int, in_a_row: int, per_epoch: int) -> None:
    sink.log_event("warning", f"step {step} skipped: no sample survived the LBES filters")
    if in_a_row >= per_epoch:
        raise RuntimeError(
            "a whole epoch of batches was skipped by the LBES filters; "
            "loosen top_k_* / exclude_same_rewards_samples"
        )
