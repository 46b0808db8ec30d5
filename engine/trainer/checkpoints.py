"""Checkpoints: what a run saves so that a resumed run continues exactly, and its final model.

checkpoint-STEP/ holds the serving weights as a Hugging Face folder, the fp32 master copy
(what a resume reads), the trained adapter with `perturbation: lora`, and the trainer state.
All randomness derives from (seed, step, position), so no RNG state has to be kept.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path

from engine.backends.pool import EnginePool
from engine.batches import Position
from engine.config import RunConfig
from engine.lowrank.population import LoraPopulation
from engine.sink import Sink
from engine.trainer.reporting import Totals

STATE_FILE = "trainer_state.json"
MASTER_DIR = "master"


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


class Checkpoints:
    """One run's saves, each told to the sink. It remembers the last step saved, so that a
    stop right after a regular save does not save the same step again."""

    def __init__(
        self,
        config: RunConfig,
        pool: EnginePool,
        output_dir: Path,
        lora: LoraPopulation | None,
        sink: Sink,
    ) -> None:
        self.config, self.pool, self.output_dir = config, pool, output_dir
        self.lora, self.sink = lora, sink
        self.saved = -1

    def resume(self, path: str | Path) -> TrainerState:
        state = load_checkpoint(Path(path), self.pool, self.lora)
        self.sink.log_event("info", f"resumed from {path} at step {state.global_step}")
        return state

    def save(self, state: TrainerState) -> None:
        """The save strategy's checkpoint."""
        path = save_checkpoint(self.config, self.pool, state, self.output_dir, self.lora)
        self.sink.log_checkpoint(state.global_step, str(path))
        self.saved = state.global_step

    def save_for_resume(self, state: TrainerState) -> None:
        """A stop's checkpoint, unless the save strategy just saved this step."""
        if self.saved != state.global_step:
            path = save_checkpoint(
                self.config, self.pool, state, self.output_dir, self.lora, for_resume_only=True
            )
            self.sink.log_checkpoint(state.global_step, str(path))

    def save_final(self) -> Path:
        """The trained model as a Hugging Face folder in output_dir itself."""
        self.pool.save_hf(str(self.output_dir))
        if self.lora is not None and (adapter := self.lora.save(self.output_dir)) is not None:
            self.sink.log_event("info", f"trained adapter saved to {adapter}")
        self.sink.log_event("info", f"final model saved to {self.output_dir}")
        return self.output_dir


def save_checkpoint(
    config: RunConfig,
    pool: EnginePool,
    state: TrainerState,
    output_dir: Path,
    lora: LoraPopulation | None = None,
    *,
    for_resume_only: bool = False,
) -> Path:
    """checkpoint-STEP/ in output_dir; only save_total_limit are kept.

    A stop (cancel) checkpoint is `for_resume_only`: master and state, no Hugging Face
    folder. Writing that folder takes seconds (3.4 s for the 135M model here) that a cancel
    should not wait for, and a resume reads only the master."""
    path = output_dir / f"checkpoint-{state.global_step}"
    partial = output_dir / f".checkpoint-{state.global_step}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    if not for_resume_only:
        pool.save_hf(str(partial))
    pool.save_master(str(partial / MASTER_DIR))
    if lora is not None:
        lora.save(partial)  # adapter mode: the trained adapter
    (partial / STATE_FILE).write_text(
        json.dumps({**asdict(state), "config": config.to_flat()}, indent=2)
    )
    shutil.rmtree(path, ignore_errors=True)
    partial.rename(path)  # a checkpoint folder is complete or absent, never half-written
    for old in list_checkpoints(output_dir)[: -config.eval.save_total_limit]:
        shutil.rmtree(old)
    return path


def list_checkpoints(output_dir: Path) -> list[Path]:
    found = [p for p in output_dir.glob("checkpoint-*") if (p / STATE_FILE).is_file()]
    return sorted(found, key=lambda p: int(p.name.split("-")[1]))


def load_checkpoint(
    path: Path, pool: EnginePool, lora: LoraPopulation | None = None
) -> TrainerState:
    state_file = path / STATE_FILE
    if not state_file.is_file():
        raise FileNotFoundError(f"{path} is not a checkpoint: {STATE_FILE} is missing")
    data = json.loads(state_file.read_text())
    pool.load_master(str(path / MASTER_DIR))
    if lora is not None:
        lora.load(path)
    return TrainerState(
        global_step=data["global_step"],
        epoch=data["epoch"],
        batch=data["batch"],
        alignment=data.get("alignment"),
        totals=Totals(**data.get("totals", {})),
    )
