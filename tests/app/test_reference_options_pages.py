"""The Run page and its charts with the reference options: the Checkpoints tab marks
save_best_model's best checkpoint (read from the trainer state the toy run of
tests/unit/test_trainer.py wrote), and the planned learning rate follows learning_rate_rule."""

from __future__ import annotations

import pytest
import streamlit as st

from app import run_charts
from engine import metrics as mk
from engine.sink import MemorySink
from engine.trainer import train
from jobs.store.status import RunStatus
from jobs.store.store import Store
from tests.app.test_pages import page
from tests.unit.test_trainer import ToyPool
from tests.unit.test_trainer import make_config as toy_config


def test_the_checkpoints_tab_marks_the_best(seeded_url, dataset, tmp_path, monkeypatch):
    monkeypatch.setenv("ESLAB_DATABASE_URL", seeded_url)
    st.cache_resource.clear()
    config = toy_config(
        str(dataset),
        tmp_path / "toy",
        save_best_model=True,
        save_strategy="steps",
        save_steps=5,
        reward_func_path="engine.rewards.conciseness.compute_score",
    )
    sink = MemorySink()
    train(config, sink, pool=ToyPool())  # evaluations -18, -2, -2: the best is step 5
    store = Store(seeded_url)
    try:
        run = store.create_run(
            name="best-run",
            method="es",
            config=config.to_flat(),
            total_steps=10,
            status=RunStatus.SUCCEEDED,
        )
        for step, path in sink.checkpoints:
            store.add_checkpoint(run.id, step, path)
        at = page("app_pages/run.py", run=str(run.id))
    finally:
        store.close()
        st.cache_resource.clear()
    assert not at.exception
    table = next(df.value for df in at.dataframe if "best" in df.value.columns)
    assert table[table["best"]]["step"].tolist() == [5]
    assert table["step"].tolist() == [0, 5, 10]
    labels = next(box.options for box in at.selectbox if box.label == "Checkpoint")
    assert [label for label in labels if label.endswith("(best)")] == [
        f"step 5: {tmp_path / 'toy' / 'out' / 'checkpoint-5'} (best)"
    ]


def test_the_planned_learning_rate_follows_es_at_scales_rule(seeded_url, dataset, tmp_path):
    config = toy_config(
        str(dataset),
        tmp_path / "rule",
        learning_rate=5e-7,
        learning_rate_rule="es_at_scale",
        noise_std=0.002,
        lr_scheduler_type="linear",
        lr_final=0.0,
    )
    store = Store(seeded_url)
    try:
        run = store.create_run(
            name="rule-run", method="es", config=config.to_flat(), total_steps=10
        )
        options = next(s for s in run_charts.SCHEDULES if s[0] == mk.LEARNING_RATE)
        chart = run_charts.schedule(store, run, *options).to_dict()
    finally:
        store.close()
    planned = [
        row["value"] for rows in chart["datasets"].values() for row in rows if "value" in row
    ]
    assert max(planned) == pytest.approx(2e-6)  # noise_std^2 / 2, not learning_rate


def test_the_planned_schedules_lie_on_what_the_run_recorded(seeded_url, dataset, tmp_path):
    """The dashed plan and the recorded noise_std and learning_rate meet at every step: the
    value at step s is the one step s's update used (docs/metrics.md)."""
    config = toy_config(
        str(dataset),
        tmp_path / "plan",
        max_steps=4,
        noise_std_scheduler_type="linear",
        noise_std_final=0.01,
        lr_scheduler_type="cosine",
        lr_final=0.0,
        eval_strategy="no",
    )
    sink = MemorySink()
    train(config, sink, pool=ToyPool())
    store = Store(seeded_url)
    try:
        run = store.create_run(name="plan-run", method="es", config=config.to_flat(), total_steps=4)
        for report in sink.steps:
            store.record_step(run.id, report)
        charts = {o[0]: run_charts.schedule(store, run, *o).to_dict() for o in run_charts.SCHEDULES}
    finally:
        store.close()
    for key, chart in charts.items():
        planned, used = (chart["datasets"][layer["data"]["name"]] for layer in chart["layer"])
        recorded = dict(sink.series(key))
        assert sorted(recorded) == [1, 2, 3, 4]
        assert {row["step"]: row["value"] for row in used} == pytest.approx(recorded)
        assert {row["step"]: row["value"] for row in planned} == pytest.approx(recorded), key
