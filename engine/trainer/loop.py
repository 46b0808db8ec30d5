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
from engine.paths import resolve_path
from engine.reporters import open_reporters
from engine.schedules import schedule_value
from engine.sink import FanoutSink, Sink
from engine.slot_population import SlotPopulation
from engine.trainer.checkpoints import Checkpoints, TrainerState
from engine.trainer.es_step import es_step
from engine.trainer.evaluation import evaluate
from engine.trainer.lbes_step import lbes_step
from engine.trainer.preflight import TrainingData, load_data, start_pool, start_slots
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
    # report_to's trackers first: a missing extra fails before the engines start.
    sink = FanoutSink(sink, open_reporters(config, output_dir))
    owns_pool = pool is None
    slots = None
    try:
        pool = pool or start_pool(config, sink)
        slots = start_slots(config, sink)
        checkpoints = Checkpoints(config, pool, output_dir, slots, sink)
        state = TrainerState() if resume_from is None else checkpoints.resume(resume_from)
        aligner = Aligner.for_run(config, state.alignment)
        step_fn = _step_function(config, slots, aligner)
        evaluating = config.eval.eval_strategy != "no"
        if evaluating and config.eval.eval_before_train and state.global_step == 0:
            baseline = evaluate(
                config, pool, data.eval_set, step=0, aligner=aligner, eval_parts=data.eval_parts
            )
            sink.log_step(baseline)
            checkpoints.keep_if_best(state, baseline)

        # -- the loop
        # Each pass draws one batch, as nlp-waseda/lbes's loop over epochs and batches: the run
        # ends after total_steps batches (num_train_epochs of them, or max_steps), whether or
        # not LBES skipped some of them. The heartbeat counts the batches drawn, as the
        # reference's progress bar does (a skipped step included); metrics are at the global
        # step, which a skipped step does not advance.
        skipped = 0
        while data.batches.drawn(state.position) < data.total_steps:
            started = time.perf_counter()
            examples = data.examples(state.position)
            position, epoch_ended = data.batches.advance(state.position)
            last = data.batches.drawn(position) == data.total_steps
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
                # LBES found nothing informative: the batch is used up, but the global step and
                # the schedules do not advance (nlp-waseda/lbes `lbes_trainer.py`).
                state = replace(state, epoch=position.epoch, batch=position.batch)
                skipped += 1
                _warn_skipped(sink, state.global_step + 1, skipped, data.batches.per_epoch)
                _after_skip(config, pool, data, checkpoints, sink, state, epoch_ended, last)
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
                evaluate(
                    config,
                    pool,
                    data.eval_set,
                    step=step,
                    aligner=aligner,
                    eval_parts=data.eval_parts,
                )
                if _due(
                    config.eval.eval_strategy,
                    config.eval.eval_steps,
                    step,
                    epoch_ended,
                    last,
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
            if logging_due(config, step, data.total_steps) or last:
                sink.log_step(report)
            elif evaluation is not None:
                sink.log_step(evaluation)  # logging_steps thins the training metrics only
            if evaluation is not None:
                checkpoints.keep_if_best(state, evaluation)
            if _due(
                config.eval.save_strategy,
                config.eval.save_steps,
                step,
                epoch_ended,
                last,
            ):
                checkpoints.save(state)
            sink.heartbeat(data.batches.drawn(position))
            if should_stop is not None and not last and should_stop():
                checkpoints.save_for_resume(state)
                raise TrainingStopped(f"stopped after step {step}, checkpoint saved")

        # -- the final model
        return checkpoints.save_final()
    finally:
        if slots is not None:
            slots.close()
        if owns_pool and pool is not None:
            pool.shutdown()
        sink.close()


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
        es.initial_learning_rate,
        es.lr_final,
        step,
        total_steps,
        rate=es.lr_scheduler_rate,
        power=es.lr_scheduler_power,
    )
    return noise_std, learning_rate


def _step_function(
    config: RunConfig, slots: SlotPopulation | None, aligner: Aligner | None
) -> Callable[..., object]:
    if config.method == "es":
        return functools.partial(es_step, slots=slots, aligner=aligner)
    return functools.partial(lbes_step, slots=slots)


def _due(strategy: str, every: int | None, step: int, epoch_ended: bool, last: bool) -> bool:
    """Whether an eval or save strategy ("no", "steps" or "epoch") asks for `step`; `last`:
    the run's last batch."""
    if strategy == "steps":
        return step % (every or 1) == 0 or last
    return strategy == "epoch" and (epoch_ended or last)


def _after_skip(
    config: RunConfig,
    pool: EnginePool,
    data: TrainingData,
    checkpoints: Checkpoints,
    sink: Sink,
    state: TrainerState,
    epoch_ended: bool,
    last: bool,
) -> None:
    """After a skipped batch: the heartbeat (the batches drawn, this one included), and the
    eval and save of an epoch's end (the reference's come after its loop over an epoch's
    batches, skipped or not) or of the run's last batch, at the global step the skipped batch
    leaves unchanged. The "steps" strategy asks only at the last batch, and only for a step
    that its step rule did not already ask for; step 0 is never asked for again
    (eval_before_train evaluated it)."""
    step = state.global_step
    sink.heartbeat(data.batches.drawn(state.position))

    def due(strategy: str, every: int | None) -> bool:
        if step == 0:
            return False
        if strategy == "steps":
            return last and step % (every or 1) != 0
        return strategy == "epoch" and (epoch_ended or last)

    if due(config.eval.eval_strategy, config.eval.eval_steps):
        evaluation = evaluate(config, pool, data.eval_set, step=step, eval_parts=data.eval_parts)
        sink.log_step(evaluation)
        checkpoints.keep_if_best(state, evaluation)
    if due(config.eval.save_strategy, config.eval.save_steps):
        checkpoints.save(state)


def _warn_skipped(sink: Sink, step: int, in_a_row: int, per_epoch: int) -> None:
    sink.log_event("warning", f"step {step} skipped: no sample survived the LBES filters")
    if in_a_row >= per_epoch:
        raise RuntimeError(
            "a whole epoch of batches was skipped by the LBES filters; "
            "loosen top_k_* / exclude_same_rewards_samples"
        )
