"""Weights & Biases: one W&B run per attempt, its files in OUTPUT_DIR/wandb, every metric at
its step. W&B reads its own settings from the environment: WANDB_MODE=offline keeps
everything on disk for a later `wandb sync` (a machine without network, or without a W&B
account), WANDB_PROJECT names the project (ES Lab's default is `eslab`), WANDB_API_KEY logs
in for online runs."""

from __future__ import annotations

import os
from pathlib import Path

from engine.config import RunConfig
from engine.extras import require
from engine.sink import StepReport

DEFAULT_PROJECT = "eslab"


class WandbSink:
    def __init__(self, output_dir: Path, config: RunConfig) -> None:
        wandb = require("wandb", "wandb", "report_to: wandb")
        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT") or DEFAULT_PROJECT,
            name=config.logging.run_name or output_dir.name,
            dir=str(output_dir),
            config=config.to_flat(),
        )

    def log_step(self, report: StepReport) -> None:
        self.run.log(dict(report.metrics), step=report.step)

    def log_checkpoint(self, step: int, path: str) -> None:
        """W&B's files are metrics; checkpoints stay in the run's folder."""

    def log_event(self, level: str, message: str) -> None:
        """Events are in ES Lab's store and the W&B run's console log."""

    def heartbeat(self, step: int) -> None:
        """W&B keeps its own connection alive."""

    def close(self) -> None:
        self.run.finish()
