"""Checkpoints: what a run saves so that a resumed run continues exactly, and its final model.

checkpoint-STEP/ holds the serving weights as a Hugging Face folder, the fp32 master copy
(what a resume reads), the trained adapter with `perturbation: lora`, and the trainer state.
All randomness derives from (seed, step, position), so no RNG state has to be kept.

With `save_best_model`, an evaluation whose mean reward beats every earlier one (the untrained
model's included, as ES at Scale's eval_step compares from -inf) saves that step's checkpoint,
and save_total_limit never removes it: Hugging Face Trainer's best_model_checkpoint, which
every later checkpoint's state records (best_step, best_metric) and `best_checkpoint` reads
back.
"""

from __future__ import annotations

import errno
import json
import math
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path

from engine import metrics as mk
from engine.backends.pool import EnginePool
from engine.batches import Position
from engine.config import RunConfig
from engine.sink import Sink, StepReport
from engine.slot_population import SlotPopulation
from engine.trainer.reporting import Totals

STATE_FILE = "trainer_state.json"
MASTER_DIR = "master"
BEST_METRIC = mk.reward_key(mk.EVAL)
"""What save_best_model compares: the eval set's mean reward; higher is better."""


@dataclass(frozen=True)
class TrainerState:
    """Everything besides the weights that a resumed run needs to continue exactly."""

    global_step: int = 0
    epoch: int = 0
    batch: int = 0
    alignment: dict | None = None  # Aligner.snapshot(): lambda and its J_C average
    totals: Totals = field(default_factory=Totals)  # train/num_tokens, time/total so far

    @property
    def position(self) -> Position:
        return Position(self.epoch, self.batch)


@dataclass(frozen=True)
class Best:
    """save_best_model: the step of the best evaluation so far and its BEST_METRIC."""

    best_step: int
    best_metric: float


class Checkpoints:
    """One run's saves, each told to the sink. It remembers the last step saved, so that a
    stop right after a regular save does not save the same step again."""

    def __init__(
        self,
        config: RunConfig,
        pool: EnginePool,
        output_dir: Path,
        slots: SlotPopulation | None,
        sink: Sink,
    ) -> None:
        self.config, self.pool, self.output_dir = config, pool, output_dir
        self.slots, self.sink = slots, sink
        self.saved = -1
        self.best: Best | None = None

    def resume(self, path: str | Path) -> TrainerState:
        state = load_checkpoint(Path(path), self.pool, self.slots)
        self.best = read_best(Path(path))
        self.sink.log_event("info", f"resumed from {path} at step {state.global_step}")
        return state

    def save(self, state: TrainerState) -> None:
        """The save strategy's checkpoint, unless this step's is saved already (the best)."""
        if self.saved == state.global_step:
            return
        path = save_checkpoint(
            self.config, self.pool, state, self.output_dir, self.slots, best=self.best
        )
        self._record(state, path)
        self.saved = state.global_step

    def keep_if_best(self, state: TrainerState, evaluation: StepReport) -> None:
        """With save_best_model: when `evaluation` (of `state`'s step) beats the best so far,
        save this step's checkpoint as the new best (strictly better: a tie keeps the
        earlier)."""
        value = evaluation.metrics.get(BEST_METRIC)
        if not self.config.eval.save_best_model or value is None or not math.isfinite(value):
            return
        previous = self.best
        if previous is not None and value <= previous.best_metric:
            return
        self.best = Best(state.global_step, value)
        self.saved = -1  # a regular save of this step did not know it was the best
        self.save(state)
        before = (
            "the first evaluation"
            if previous is None
            else f"previous best {previous.best_metric:.6g} at step {previous.best_step}"
        )
        self.sink.log_event(
            "info",
            f"best model so far: checkpoint-{state.global_step}, {BEST_METRIC} {value:.6g} "
            f"({before})",
        )

    def save_for_resume(self, state: TrainerState) -> None:
        """A stop's checkpoint, unless the save strategy just saved this step."""
        if self.saved != state.global_step:
            path = save_checkpoint(
                self.config,
                self.pool,
                state,
                self.output_dir,
                self.slots,
                for_resume_only=True,
                best=self.best,
            )
            self._record(state, path)

    def _record(self, state: TrainerState, path: Path) -> None:
        """Record a new checkpoint, then rotate the old ones away: a worker stopped between
        the two leaves one checkpoint too many, never a record of one that is gone (a soak
        found a cancelled run whose recorded checkpoint had been rotated away before the
        new one was recorded, so its resume failed)."""
        self.sink.log_checkpoint(state.global_step, str(path))
        rotate_checkpoints(self.config, self.output_dir, self.best)

    def save_final(self) -> Path:
        """The trained model as a Hugging Face folder in output_dir itself."""
        self.pool.save_hf(str(self.output_dir))
        if self.slots is not None and (adapter := self.slots.save(self.output_dir)) is not None:
            self.sink.log_event("info", f"trained adapter saved to {adapter}")
        self.sink.log_event("info", f"final model saved to {self.output_dir}")
        return self.output_dir


def save_checkpoint(
    config: RunConfig,
    pool: EnginePool,
    state: TrainerState,
    output_dir: Path,
    slots: SlotPopulation | None = None,
    *,
    for_resume_only: bool = False,
    best: Best | None = None,
) -> Path:
    """checkpoint-STEP/ in output_dir (`rotate_checkpoints` keeps save_total_limit of them,
    once the new one is recorded).

    A stop (cancel) checkpoint is `for_resume_only`: master and state, no Hugging Face
    folder. Writing that folder takes seconds (3.4 s for the 135M model here) that a cancel
    should not wait for, and a resume reads only the master. The `best` checkpoint
    (save_best_model) is recorded in the state and kept besides the save_total_limit newest."""
    path = output_dir / f"checkpoint-{state.global_step}"
    partial = output_dir / f".checkpoint-{state.global_step}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    try:
        if not for_resume_only:
            pool.save_hf(str(partial))
        pool.save_master(str(partial / MASTER_DIR))
        if slots is not None:
            slots.save(partial)  # lora's adapter mode: the trained adapter
        (partial / STATE_FILE).write_text(
            json.dumps(
                {**asdict(state), **(asdict(best) if best else {}), "config": config.to_flat()},
                indent=2,
            )
        )
    except Exception as exc:
        shutil.rmtree(partial, ignore_errors=True)  # its space back, for the next attempt
        if disk_full(exc):
            raise CheckpointWriteError(disk_full_message(path, output_dir)) from exc
        raise
    shutil.rmtree(path, ignore_errors=True)
    partial.rename(path)  # a checkpoint folder is complete or absent, never half-written
    return path


def rotate_checkpoints(config: RunConfig, output_dir: Path, best: Best | None) -> None:
    """Keep the save_total_limit newest checkpoints, and the best one besides."""
    kept = f"checkpoint-{best.best_step}" if best else None
    rotated = [p for p in list_checkpoints(output_dir) if p.name != kept]
    for old in rotated[: -config.eval.save_total_limit]:
        shutil.rmtree(old)


class CheckpointWriteError(OSError):
    """A checkpoint could not be written for want of space; the earlier ones stand."""


def disk_full(exc: BaseException) -> bool:
    """Whether `exc`, or an error it wraps (Ray wraps an engine actor's), is a full disk or
    an exhausted quota."""
    seen: BaseException | None = exc
    while seen is not None:
        if getattr(seen, "errno", None) in (errno.ENOSPC, errno.EDQUOT):
            return True
        if "No space left on device" in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def disk_full_message(path: Path, output_dir: Path) -> str:
    """What a user needs when the disk fills under a save: which disk, how full, what is
    safe, and how to go on."""
    try:
        usage = shutil.disk_usage(output_dir)
        room = f"{usage.free / 2**20:,.0f} MiB free of {usage.total / 2**30:,.1f} GiB"
    except OSError:
        room = "its size unknown"
    kept = [p.name for p in list_checkpoints(output_dir)]
    then = (
        f"the earlier checkpoints are intact ({', '.join(kept)}). Free space there, then "
        "resume the run (eslab resume RUN) to continue from the last of them."
        if kept
        else "there is no earlier checkpoint. Free space there, then run it again."
    )
    return (
        f"{path.name} could not be written: no space left on the disk of {output_dir} "
        f"({room}). Nothing of it was kept, the recorded metrics stand, and {then}"
    )


def list_checkpoints(output_dir: Path) -> list[Path]:
    found = [p for p in output_dir.glob("checkpoint-*") if (p / STATE_FILE).is_file()]
    return sorted(found, key=lambda p: int(p.name.split("-")[1]))


def load_checkpoint(
    path: Path, pool: EnginePool, slots: SlotPopulation | None = None
) -> TrainerState:
    state_file = path / STATE_FILE
    if not state_file.is_file():
        raise FileNotFoundError(f"{path} is not a checkpoint: {STATE_FILE} is missing")
    data = json.loads(state_file.read_text())
    pool.load_master(str(path / MASTER_DIR))
    if slots is not None:
        slots.load(path)
    return TrainerState(
        global_step=data["global_step"],
        epoch=data["epoch"],
        batch=data["batch"],
        alignment=data.get("alignment"),
        totals=Totals(**data.get("totals", {})),
    )


def read_best(path: Path) -> Best | None:
    """The best checkpoint that checkpoint `path` knew of (save_best_model), or None."""
    data = json.loads((path / STATE_FILE).read_text())
    if data.get("best_step") is None:
        return None
    return Best(data["best_step"], data["best_metric"])


def best_checkpoint(output_dir: Path) -> Path | None:
    """The best checkpoint of save_best_model, as the newest checkpoint's state records it;
    None when there is none (or the option was off)."""
    found = list_checkpoints(output_dir)
    best = read_best(found[-1]) if found else None
    if best is None:
        return None
    path = output_dir / f"checkpoint-{best.best_step}"
    return path if (path / STATE_FILE).is_file() else None
