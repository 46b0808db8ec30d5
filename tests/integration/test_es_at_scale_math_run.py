"""The es-at-scale-math preset's first iteration on the real engine: DatasetDicts in ES at
Scale's layout (written by Hugging Face `datasets`' save_to_disk) converted by `eslab data
math`, trained on with the preset's settings except what only GPUs afford (the default model,
2 members, 2 prompts, 16 tokens, the two evaluation sets of the fixture), and pass@1 of each
set and their mean reported at each evaluation, under ES at Scale's keys, with the boxed
grader running in the reward process."""

from __future__ import annotations

import pytest

from app.cli import main
from engine import metrics as mk
from engine.presets import load_preset
from engine.sink import MemorySink
from engine.trainer import train
from tests.unit.test_math_es_at_scale import FIXTURE

pytestmark = pytest.mark.heavy


def test_the_presets_first_iteration_reports_each_set_and_their_mean(
    pool, tmp_path, default_model_dir
):
    data = tmp_path / "data"
    command = ["data", "math", "--input", str(FIXTURE / "eval"), "--train", str(FIXTURE / "train")]
    assert main([*command, "--out", str(data)]) == 0
    preset = load_preset("es-at-scale-math")
    sets = f"aime={data / 'eval' / 'aime.parquet'},math500={data / 'eval' / 'math500.parquet'}"
    config = preset.with_overrides(
        [
            f"model={default_model_dir}",
            f"train_file={data / 'train.parquet'}",
            f"eval_sets={sets}",
            f"output_dir={tmp_path / 'out'}",
            "population_size=2",
            "data_batch_size=2",
            "max_tokens=16",
            "max_steps=1",
            "eval_steps=1",
        ]
    )
    sink = MemorySink()
    train(config, sink, pool=pool)
    (step,) = [r for r in sink.steps if r.step == 1]
    assert step.metrics[mk.NOISE_STD] == 0.001
    assert step.metrics[mk.LEARNING_RATE] == pytest.approx(0.001**2 / 2)
    assert len(step.population) == 2
    for key in (mk.eval_set_key("aime"), mk.eval_set_key("math500"), mk.EVAL_SETS_MEAN):
        values = dict(sink.series(key))
        assert set(values) == {0, 1}, key  # before training and after the step
        assert all(0.0 <= value <= 1.0 for value in values.values()), key
    assert step.metrics[mk.EVAL_SETS_MEAN] == pytest.approx(
        (step.metrics[mk.eval_set_key("aime")] + step.metrics[mk.eval_set_key("math500")]) / 2
    )
    assert step.metrics[mk.EVAL_TOTAL_SAMPLES] == 3
