"""A Sink that shows a progress bar on the command line and passes everything on."""

from __future__ import annotations

from tqdm import tqdm

from engine import metrics as mk
from engine.sink import Sink, StepReport


class ProgressSink:
    def __init__(self, inner: Sink, total_steps: int, description: str = "training") -> None:
        self.inner = inner
        self.bar = tqdm(total=total_steps, desc=description, unit="step", dynamic_ncols=True)

    def log_step(self, report: StepReport) -> None:
        self.inner.log_step(report)
        shown = {
            k.split("/", 1)[0] + " " + k.split("/")[1]: v
            for k, v in report.metrics.items()
            if k in (mk.reward_key(mk.TRAIN), mk.reward_key(mk.EVAL))
        }
        if shown:
            self.bar.set_postfix({k: f"{v:.3g}" for k, v in shown.items()}, refresh=False)

    def log_checkpoint(self, step: int, path: str) -> None:
        self.inner.log_checkpoint(step, path)

    def log_event(self, level: str, message: str) -> None:
        self.inner.log_event(level, message)
        if level in ("warning", "error"):
            self.bar.write(f"{level}: {message}")

    def heartbeat(self, step: int) -> None:
        """The bar counts the heartbeat's steps, a skipped LBES step included, as the
        dashboard does."""
        self.inner.heartbeat(step)
        self.bar.update(step - self.bar.n)

    def close(self) -> None:
        self.bar.close()
