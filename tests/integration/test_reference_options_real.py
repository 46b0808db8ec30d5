"""The reference options on the real engine (vLLM on the CPU, the default model): the reward
functions run in their time-limited child process (reward_timeout_seconds' default),
save_best_model keeps a loadable Hugging Face checkpoint, and report_to: tensorboard writes
event files that TensorBoard's own reader reads back."""

from __future__ import annotations

import json

import pytest

from engine import metrics as mk
from engine.sink import MemorySink
from engine.trainer import train
from engine.trainer.checkpoints import best_checkpoint
from tests.integration.test_training import CONCISENESS, conciseness_config

pytestmark = pytest.mark.heavy


def test_a_tiny_real_run_reports_to_tensorboard_and_keeps_its_best_model(pool, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    config = conciseness_config(
        tmp_path,
        max_steps=2,
        max_tokens=8,  # 11 generate calls; a decode step is ~0.17 s on the CPU whatever the batch
        eval_file=str(CONCISENESS / "test.parquet"),
        eval_strategy="steps",
        eval_steps=1,
        save_best_model=True,
        save_total_limit=1,
        report_to="tensorboard",
    )
    assert config.reward.reward_timeout_seconds == 10.0
    sink = MemorySink()
    train(config, sink, pool=pool)
    out = tmp_path / "out"
    evals = sink.series(mk.reward_key(mk.EVAL))
    assert [s for s, _ in evals] == [0, 1, 2]
    best_step = max(evals, key=lambda e: (e[1], -e[0]))[0]  # the first of the highest
    best = best_checkpoint(out)
    assert best == out / f"checkpoint-{best_step}"
    assert (best / "config.json").is_file()  # a Hugging Face folder transformers can load
    state = json.loads((best / "trainer_state.json").read_text())
    assert state["best_metric"] == max(v for _, v in evals)

    events = EventAccumulator(str(out / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    for key in (mk.reward_key(mk.TRAIN), mk.reward_key(mk.EVAL)):
        assert [(e.step, e.value) for e in events.Scalars(key)] == [
            (s, pytest.approx(v)) for s, v in sink.series(key)
        ]
