"""`report_key_names: reference`: the trackers also get each metric under the key name the
method's reference repository logs the same quantity as, so that a W&B or TensorBoard chart of
an ES Lab run overlays the reference's own runs.

ES Lab's keys are nlp-waseda/lbes's (docs/metrics.md), so an LBES run needs nothing more.
VsonicV/es-at-scale (`es_at_scale/trainer/es_trainer.py`) and the jbejjani2022 fork's
alignment script (`alignment/es-fine-tuning_alignment_accl_api.py`) log under other names, and
ES at Scale uses one of ES Lab's names for another quantity: its `train/reward/std` is the
spread of the members' mean rewards, ES Lab's the spread of every sample's reward. On a clash
the reference's meaning gets the name on the trackers and ES Lab's value goes there as
`eslab/<key>`; ES Lab's own store keeps its names whatever this option says.

Only quantities that mean the same are mapped: ES at Scale's min, max and std of the members'
mean response lengths have no ES Lab counterpart and are not sent.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from engine import metrics as mk
from engine.sink import ForwardingSink, Reporter, StepReport

if TYPE_CHECKING:
    from engine.config import RunConfig

KEY_NAMES = ("eslab", "reference")
CLASH_PREFIX = "eslab/"


@dataclass(frozen=True)
class Reference:
    """A reference's key names: `keys` maps each of its keys to ES Lab's key of the same
    quantity; `settings` are keys it logs at every training step from its configuration."""

    name: str
    keys: Mapping[str, str]
    settings: Mapping[str, Callable[[RunConfig, int], float]] = field(default_factory=dict)


def _stats(theirs: str, ours: str, stats: tuple[str, ...] = mk.STATS) -> dict[str, str]:
    return {f"{theirs}/{s}": mk.reward_key(mk.TRAIN, ours, s) for s in stats}


ES_AT_SCALE = Reference(
    "VsonicV/es-at-scale",
    {
        mk.reward_key(mk.TRAIN): mk.reward_key(mk.TRAIN),  # equal batches: the members' mean
        **_stats("train/reward", mk.POPULATION_REWARD, ("std", "min", "max")),
        "train/response-length/mean": mk.completion_key(mk.TRAIN, "mean_length"),
        "train/es/sigma": mk.NOISE_STD,
        "train/es/alpha": mk.LEARNING_RATE,
    },
    {
        "global_step": lambda config, step: float(step),  # its W&B step metric
        "train/es/population": lambda config, step: float(config.es.population_size),
    },
)

ALIGNMENT_FORK = Reference(
    "jbejjani2022/es-fine-tuning-paper (alignment)",
    {
        **_stats("combined", "objective"),
        "helpfulness/mean": mk.reward_key(mk.TRAIN),
        "cost/mean": mk.reward_key(mk.TRAIN, "cost"),
        "safety/safe_ratio": mk.SAFE_RATIO,
        "lambda/J_C": mk.JC,
        "lambda/J_C_raw": mk.JC_RAW,
        "lambda/J_C_ema": mk.JC_SMOOTHED,
        "lambda/value": mk.LAMBDA_NEXT,
        "lambda/d": mk.COST_THRESHOLD,
        "eval/mean_reward": mk.reward_key(mk.EVAL),
        "eval/mean_cost": mk.reward_key(mk.EVAL, "cost"),
        mk.EVAL_MEAN_COMBINED: mk.EVAL_MEAN_COMBINED,
        mk.EVAL_TOTAL_SAMPLES: mk.EVAL_TOTAL_SAMPLES,
    },
)


def reference_of(config: RunConfig) -> Reference | None:
    """The reference whose key names a run of `config` shares charts with; None for LBES,
    whose names are ES Lab's."""
    if config.alignment.scorer_url is not None:
        return ALIGNMENT_FORK
    return ES_AT_SCALE if config.method == "es" else None


def reference_metrics(
    metrics: Mapping[str, float], step: int, reference: Reference, config: RunConfig
) -> dict[str, float]:
    """`metrics` as the trackers get them in reference mode: every value under the
    reference's key where it has one, ES Lab's keys besides, and an ES Lab key that the
    reference uses for another quantity moved to `eslab/<key>`."""
    out = {
        (CLASH_PREFIX + key if reference.keys.get(key, key) != key else key): value
        for key, value in metrics.items()
    }
    out.update(
        {theirs: metrics[ours] for theirs, ours in reference.keys.items() if ours in metrics}
    )
    if mk.NOISE_STD in metrics:  # a training step: the reference logs its settings with it
        out.update({key: setting(config, step) for key, setting in reference.settings.items()})
    return out


class ReferenceKeys(ForwardingSink):
    """A reporter that hands `inner` every step's metrics in reference mode."""

    def __init__(self, inner: Reporter, reference: Reference, config: RunConfig) -> None:
        super().__init__(inner)
        self.reporter, self.reference, self.config = inner, reference, config

    def log_step(self, report: StepReport) -> None:
        metrics = reference_metrics(report.metrics, report.step, self.reference, self.config)
        self.inner.log_step(replace(report, metrics=metrics))

    def close(self) -> None:
        self.reporter.close()
