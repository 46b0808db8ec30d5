"""A queued run never writes into another run's files: its output_dir may not be, hold or lie
in any stored run's (whatever that run's status), compared after resolving `..` and links,
nor a folder that already holds a model or checkpoints. Resuming a run keeps its folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.config import ConfigError, RunConfig
from jobs.launch import queue_run
from jobs.store.status import RunStatus
from tests.jobs.helpers import CONCISENESS

HUB_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"  # a hub name: queueing does not load it


@pytest.fixture
def runs(tmp_path, monkeypatch) -> Path:
    """The folder the runs' output folders lie in (inside the data folder)."""
    monkeypatch.setenv("ESLAB_DATA_DIR", str(tmp_path / "data"))
    folder = tmp_path / "data" / "runs"
    folder.mkdir(parents=True)
    return folder


def config(output_dir: Path | str) -> RunConfig:
    return RunConfig.from_flat(
        {
            "method": "es",
            "model": HUB_MODEL,
            "train_file": str(CONCISENESS / "train.parquet"),
            "output_dir": str(output_dir),
            "reward_func_path": "engine.rewards.conciseness.compute_score",
            "max_steps": 2,
            "population_size": 2,
        }
    )


def stored_run(store, output_dir: Path, status: RunStatus):
    """A run stored as `status` (as its worker would have left it), writing to `output_dir`."""
    flat = config(output_dir).with_resolved_paths().to_flat()
    return store.create_run(name="other", method="es", config=flat, status=status)


def refusal(store, output_dir: Path | str) -> str:
    with pytest.raises(ConfigError) as info:
        queue_run(store, config(output_dir))
    [error] = info.value.errors
    assert error.field == "output_dir" and error.message.startswith("data.output_dir ")
    return error.message


@pytest.mark.parametrize(
    "status", [RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.QUEUED]
)
def test_the_folder_of_a_run_of_any_status_is_refused(store, runs, status):
    first = stored_run(store, runs / "a", status)
    message = refusal(store, runs / "a")
    assert f"is in use by run {first.id} ({status.value})" in message
    assert "give this run a folder of its own" in message
    assert store.count_runs() == 1


@pytest.mark.parametrize(
    ("output_dir", "relation"),
    [
        ("a/checkpoint-2", "lies in the output folder of run"),
        ("a/sub/deeper", "lies in the output folder of run"),
        (".", "holds the output folder of run"),
        ("x/../a", "is in use by run"),  # not normalised before
        ("link", "is in use by run"),  # a symbolic link to the run's folder
        ("link/sub", "lies in the output folder of run"),
    ],
)
def test_a_folder_in_or_around_another_runs_is_refused(store, runs, output_dir, relation):
    (runs / "a").mkdir()
    (runs / "link").symlink_to(runs / "a")
    first = stored_run(store, runs / "a", RunStatus.SUCCEEDED)
    assert f"{relation} {first.id} (succeeded)" in refusal(store, f"{runs}/{output_dir}")


@pytest.mark.parametrize(
    ("files", "held"),
    [
        (["config.json"], "config.json"),
        (["model.safetensors"], "model.safetensors"),
        (["checkpoint-3/trainer_state.json"], "checkpoint-3"),
    ],
)
def test_a_folder_that_holds_a_model_or_checkpoints_is_refused(store, runs, files, held):
    """A deleted run's, or a foreground run's of another database: no record names them."""
    for name in files:
        (runs / "old" / name).parent.mkdir(parents=True, exist_ok=True)
        (runs / "old" / name).write_text("{}")
    assert f"already holds {held}, which no new run may write over" in refusal(store, runs / "old")
    assert store.count_runs() == 0


def test_a_folder_of_its_own_beside_others_is_accepted_and_a_resume_keeps_its_own(store, runs):
    first = queue_run(store, config(runs / "a"))
    (runs / "a" / "checkpoint-2").mkdir(parents=True)
    (runs / "a" / "checkpoint-2" / "trainer_state.json").write_text("{}")
    (runs / "a-clone").mkdir()  # a name that starts like the other's is no part of it
    second = queue_run(store, config(runs / "a-clone"))
    assert second.status is RunStatus.QUEUED
    store.set_status(first.id, RunStatus.FAILED)  # queued -> failed: its job never started
    resumed = store.resume_run(first.id, 2)  # the same run continues in its own folder
    assert resumed.status is RunStatus.QUEUED and resumed.config["output_dir"] == str(runs / "a")
