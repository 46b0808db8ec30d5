"""TensorBoard event files: every metric as a scalar at its step, the population's fitness as
a histogram, checkpoints and events as text, the configuration once. `tensorboard --logdir
OUTPUT_DIR/tensorboard` opens them, live too: the file is flushed after every step."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from engine.config import RunConfig
from engine.extras import require
from engine.sink import StepReport

FITNESS_HISTOGRAM = "train/population/fitness"


class TensorBoardSink:
    def __init__(self, log_dir: Path, config: RunConfig) -> None:
        tensorboard = require("torch.utils.tensorboard", "tensorboard", "report_to: tensorboard")
        self.writer = tensorboard.SummaryWriter(log_dir=str(log_dir))
        self.step = 0
        self.writer.add_text("config", _code_block(config.to_yaml()), 0)
        self.writer.flush()

    def log_step(self, report: StepReport) -> None:
        self.step = report.step
        for key, value in report.metrics.items():
            self.writer.add_scalar(key, value, report.step, walltime=report.wall_time)
        fitness = [
            p.fitness
            for p in report.population
            if p.fitness is not None and math.isfinite(p.fitness)
        ]
        if fitness:
            self.writer.add_histogram(
                FITNESS_HISTOGRAM, np.asarray(fitness), report.step, walltime=report.wall_time
            )
        self.writer.flush()

    def log_checkpoint(self, step: int, path: str) -> None:
        self.writer.add_text("checkpoints", path, step)

    def log_event(self, level: str, message: str) -> None:
        self.writer.add_text("events", f"{level}: {message}", self.step)

    def heartbeat(self, step: int) -> None:
        """The event file needs no heartbeat."""

    def close(self) -> None:
        self.writer.close()


def _code_block(text: str) -> str:
    """TensorBoard renders text as Markdown: indent it so YAML stays as written."""
    return "\n".join("    " + line for line in text.splitlines())
