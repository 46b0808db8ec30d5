"""`eslab train` as a user runs it: a preset, overrides, the real engine, the database."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from jobs.store.migrate import upgrade
from jobs.store.status import RunStatus
from jobs.store.store import Store

ESLAB = str(Path(sys.executable).with_name("eslab"))
TINY = [
    "max_steps=2",
    "max_tokens=4",  # a decode step costs ~0.17 s on the CPU whatever the batch
    "population_size=2",
    "data_batch_size=2",
    "eval_steps=2",
    "save_strategy=no",
    "max_model_len=1024",
]


@pytest.mark.heavy
def test_train_a_preset_records_the_run_in_the_database(tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path / 'eslab.db'}"
    upgrade(url)
    overrides = [*TINY, f"output_dir={tmp_path / 'out'}"]
    result = subprocess.run(
        [ESLAB, "train", "es-conciseness", *[a for o in overrides for a in ("--set", o)]],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "ESLAB_DATABASE_URL": url},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "succeeded" in result.stdout
    assert "2/2" in result.stderr  # the progress bar reached the end

    store = Store(url)
    (run,) = store.list_runs()
    assert run.status is RunStatus.SUCCEEDED and run.step == 2 and run.total_steps == 2
    assert [p.step for p in store.metric_series(run.id, "train/reward/mean")] == [1, 2]
    assert [p.step for p in store.metric_series(run.id, "eval/reward/mean")] == [0, 2]
    assert len(store.population(run.id, 1)) == 2
    assert store.samples(run.id, split="eval", step=2)
    assert (tmp_path / "out" / "model.safetensors").is_file()
    store.close()


def test_a_bad_option_is_one_line_and_stores_nothing(tmp_path):
    url = f"sqlite:///{tmp_path / 'eslab.db'}"
    upgrade(url)
    result = subprocess.run(
        [ESLAB, "train", "es-conciseness", "--set", "noise_std=-1"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "ESLAB_DATABASE_URL": url},
    )
    assert result.returncode == 2
    assert "noise_std" in result.stderr and "Traceback" not in result.stderr
    assert Store(url).count_runs() == 0
