"""The sweeps kept beside the presets (engine/presets/sweeps): one that tunes each preset meant
to learn on the default model, and the seeds sweep that runs a preset with three seeds."""

import pytest

from engine import metrics as mk
from engine.config.yaml_io import read_yaml_file
from engine.presets import (
    load_preset,
    preset_info,
    preset_names,
    sweep_space_names,
    sweep_space_path,
    tuned_presets,
)
from jobs.sweeps.spec import Objective, parse_space

TUNED = ["es-conciseness", "lbes-conciseness"]
LAST_EVAL_REWARD = Objective(mk.reward_key(mk.EVAL), "max", "last")


def space(name, preset):
    return parse_space(read_yaml_file(sweep_space_path(name)), load_preset(preset))


def test_every_preset_that_needs_nothing_more_than_the_default_model_is_tuned():
    assert tuned_presets() == TUNED
    assert sweep_space_names() == [*TUNED, "seeds"]
    for name in set(preset_names()) - set(TUNED):
        assert preset_info(name).needs  # a larger model, or the scorer


@pytest.mark.parametrize("preset", TUNED)
def test_a_tuning_sweep_ranks_by_the_last_eval_and_holds_the_presets_own_values(preset):
    spec = space(preset, preset)
    config = load_preset(preset)
    assert spec.method == "tpe" and spec.parallel == 1 and spec.budget == 6
    assert spec.objective == LAST_EVAL_REWARD  # a run that peaks, then collapses, ranks low
    stopping = spec.early_stopping
    assert stopping.rule == "median" and stopping.metric == LAST_EVAL_REWARD.metric
    assert stopping.min_step % config.eval.eval_steps == 0  # judged where evals are
    ranges = {p.name: p for p in spec.parameters}
    assert {"learning_rate", "noise_std", "lr_scheduler_type"} <= set(ranges)
    for name in ("learning_rate", "noise_std"):  # the preset is a point of its space
        found = ranges[name]
        assert found.log and found.low <= getattr(config.es, name) <= found.high
    assert config.es.lr_scheduler_type in ranges["lr_scheduler_type"].values


@pytest.mark.parametrize("preset", TUNED)
def test_the_seeds_sweep_is_a_grid_of_three_seeds(preset):
    spec = space("seeds", preset)
    assert spec.method == "grid" and spec.budget == 3 and spec.parallel == 1
    assert [(p.name, p.values) for p in spec.parameters] == [("seed", (1, 2, 3))]
    assert spec.objective == LAST_EVAL_REWARD
