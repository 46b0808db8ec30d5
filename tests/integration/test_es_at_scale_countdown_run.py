"""The es-at-scale-countdown preset's first iteration on the real engine: a file in ES at
Scale's countdown.json schema converted by `eslab data countdown --format es-at-scale
--input`, trained on with the preset's settings except what only GPUs afford (the default
model, 2 members, 2 prompts, 16 tokens), and accuracy reported at each evaluation."""

from __future__ import annotations

import pytest

from app.cli import main
from engine import metrics as mk
from engine.presets import load_preset
from engine.sink import MemorySink
from engine.trainer import train
from tests.unit.test_es_at_scale_countdown import reference_file

pytestmark = pytest.mark.heavy


def test_the_presets_first_iteration_runs_and_reports_accuracy(pool, tmp_path, default_model_dir):
    source = reference_file(tmp_path / "countdown.json", 5)
    data = tmp_path / "data"
    command = ["data", "countdown", "--format", "es-at-scale", "--input", str(source)]
    assert main([*command, "--n-train", "2", "--n-test", "3", "--out", str(data)]) == 0
    preset = load_preset("es-at-scale-countdown")
    config = preset.with_overrides(
        [
            f"model={default_model_dir}",
            f"train_file={data / 'train.parquet'}",
            f"eval_file={data / 'test.parquet'}",
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
    # the preset's own step: sigma and alpha * sigma as the reference's
    assert step.metrics[mk.NOISE_STD] == preset.es.noise_std == 0.001
    assert step.metrics[mk.LEARNING_RATE] == pytest.approx(5e-7)
    assert len(step.population) == 2
    assert 0.0 <= step.metrics[mk.TRAIN_ACCURACY] <= 1.0
    evals = dict(sink.series(mk.EVAL_ACCURACY))
    assert set(evals) == {0, 1}  # before training and after the step
    assert all(0.0 <= value <= 1.0 for value in evals.values())
    assert step.metrics[mk.EVAL_TOTAL_SAMPLES] == 3
