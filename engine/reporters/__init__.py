"""`report_to`: the experiment trackers a run also reports to, next to ES Lab's own store.

Each is a Reporter (engine/sink.py) that gets every step's metrics, checkpoints and events as
they happen, through the optional library that writes its files: `tensorboard` (event files in
OUTPUT_DIR/tensorboard, written by torch.utils.tensorboard; the `tensorboard` extra) and
`wandb` (Weights & Biases, with WANDB_MODE=offline writing OUTPUT_DIR/wandb for a later
`wandb sync`; the `wandb` extra). nlp-waseda/lbes names the option `report_to` and offers
wandb; ES at Scale logs to TensorBoard (its first release) and W&B (`--logging`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from engine.reporters.reference_keys import ReferenceKeys, reference_of
from engine.sink import Reporter

if TYPE_CHECKING:  # engine.config's rules read parse_report_to
    from engine.config import RunConfig

REPORTERS = ("tensorboard", "wandb")


def parse_report_to(value: str | None) -> list[str]:
    """The trackers `report_to` names, in order; "none" and None name none. Raises ValueError
    (a phrase that follows the option's name) for an unknown or repeated name."""
    names = [n.strip() for n in (value or "").split(",") if n.strip()]
    if names == ["none"]:
        return []
    unknown = [n for n in names if n not in REPORTERS]
    if unknown:
        raise ValueError(
            f"names {', '.join(map(repr, unknown))}, which is not a tracker: use a "
            f"comma-separated list of {', '.join(REPORTERS)}, or none"
        )
    if len(set(names)) < len(names):
        raise ValueError(f"names a tracker twice, got {value!r}")
    return names


def open_reporters(config: RunConfig, output_dir: Path) -> list[Reporter]:
    """The run's trackers, opened. Raises MissingExtra (engine/extras.py) naming the extra to
    install when a tracker's library is missing, before anything is written."""
    reporters: list[Reporter] = []
    try:
        for name in parse_report_to(config.logging.report_to):
            if name == "tensorboard":
                from engine.reporters.tensorboard_sink import TensorBoardSink

                reporters.append(TensorBoardSink(output_dir / "tensorboard", config))
            else:
                from engine.reporters.wandb_sink import WandbSink

                reporters.append(WandbSink(output_dir, config))
    except BaseException:
        for reporter in reporters:
            reporter.close()
        raise
    reference = reference_of(config)
    if config.logging.report_key_names == "reference" and reference is not None:
        return [ReferenceKeys(reporter, reference, config) for reporter in reporters]
    return reporters
